"""The example trainer under a real torchrun: 2 CPU ranks (gloo), scraped over HTTP.

Each run takes a few seconds (startup dominates). Timing checks are ratios with wide margins,
chosen to hold on a loaded 2-core machine where the two ranks contend for the cores.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import (
    LOOPBACK,
    Scrape,
    TrainerRun,
    per_step,
    scrape,
    shares,
    torchrun_example,
    wait_for,
)

from gpujob_trainer import contract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TIMEOUT = 240.0  # deadline to reach the last step: ~10 s idle, minutes on a loaded machine
SIZE = ["--hidden=256", "--layers=4", "--batch-size=512", "--steps-per-epoch=8"]
BATCH = 512


def run_to_end(
    args: list[str], tmp_path: Path, steps: int, env: dict[str, str] | None = None
) -> tuple[list[Scrape], int, float]:
    """Run, scrape the final values of both ranks, end the linger; (scrapes, rc, wall)."""
    t0 = time.time()
    with torchrun_example(args, tmp_path, env=env) as run:
        final = run.wait_steps(steps, TIMEOUT)
        wall = time.time() - t0
        rc = run.end_linger()
        assert rc == 0, run.log()
    return final, rc, wall


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Scrape], float, float]:
    """40 steps, target from GPUJOB_TOTAL_STEPS as the operator sets it (no --steps)."""
    t0 = time.time()
    final, _, wall = run_to_end(
        SIZE, tmp_path_factory.mktemp("baseline"), 40, env={contract.ENV_TOTAL_STEPS: "40"}
    )
    return final, t0, wall


def test_counts_and_phases_agree_with_what_ran(baseline: tuple[list[Scrape], float, float]) -> None:
    final, t0, wall = baseline
    steps, batch = 40, BATCH
    for rank, s in enumerate(final):
        labels = {"rank": str(rank), "local_rank": str(rank), "node_rank": "0"}
        assert s.value("gpujob_train_steps_total", **labels) == steps
        assert s.value("gpujob_train_target_steps", **labels) == steps
        assert s.value("gpujob_train_samples_total", **labels) == steps * batch
        assert s.value("gpujob_train_epoch", **labels) == steps // 8 - 1  # 0-based
        assert 0 < s.value("gpujob_train_loss", **labels) < 10
        assert s.get("gpujob_train_tokens_total") is None  # no tokens given: absent
        assert s.value("gpujob_train_step_duration_seconds_count") == steps
        assert s.value("gpujob_train_step_duration_seconds_bucket", le="+Inf") == steps
        last = s.value("gpujob_train_last_step_timestamp_seconds")
        assert t0 <= last <= t0 + wall
        phases = s.phases()
        # The phases partition each step: their sum is the step time (float rounding only).
        step_sum = s.value("gpujob_train_step_duration_seconds_sum")
        assert sum(phases.values()) == pytest.approx(step_sum, rel=1e-6)
        # ...and the steps cannot have taken longer than the whole run.
        assert 0 < step_sum < wall
        for phase in ("data_wait", "forward", "backward", "optimizer", "comm_wait", "other"):
            assert phases[phase] > 0, phase
        assert phases["checkpoint"] == 0
        compute = phases["forward"] + phases["backward"] + phases["optimizer"]
        assert s.value("gpujob_train_compute_seconds_total") == pytest.approx(compute, rel=1e-6)
        # types as the contract says, and no _created series
        # the batches reached the device through the loader: the copy is its own phase
        assert phases["h2d"] > 0
        # the model's FLOPs were counted once, per sample; a CPU has no peak, and says so
        assert s.value(contract.MODEL_FLOPS.name) > 0
        assert s.value(contract.PEAK_FLOPS.name, reason="no_gpu") == 0
        for spec in contract.TRAIN_METRICS:
            if spec not in (contract.TOKENS, contract.RANK_DEVICE):  # no GPU here: no devices
                assert s.types[spec.family] == spec.type, spec.name
        assert "_created" not in s.text
    # local rank 0 runs the NVML collector; there is no GPU here, and it says why
    assert final[0].value("gpujob_gpu_telemetry_available", reason="nvml_init_failed") == 0 or (
        final[0].value("gpujob_gpu_telemetry_available", reason="nvml_not_installed") == 0
    )
    assert final[1].get("gpujob_gpu_telemetry_available") is None


def test_slow_input_makes_data_wait_dominate(tmp_path: Path) -> None:
    # 0.2 s per batch against ~10 ms of compute: data wait stays dominant even if machine
    # load inflates compute tenfold.
    args = [*SIZE, "--batch-size=128", "--steps=10", "--slow-input=0.2"]
    final, _, _ = run_to_end(args, tmp_path, 10)
    for s in final:
        assert shares(s)["data_wait"] > 0.4, shares(s)


def test_slow_rank_has_the_most_compute_and_the_other_waits(
    tmp_path: Path, baseline: tuple[list[Scrape], float, float]
) -> None:
    # 8x the work: the gap the fast rank waits out (~7 computes) must stand well above the
    # baseline's comm wait, which a loaded machine inflates (CI saw 13 ms per step against a
    # 36 ms wait at 4x).
    final, _, _ = run_to_end(
        [*SIZE, "--steps=20", "--slow-rank=1", "--slow-factor=8"], tmp_path, 20
    )
    fast, slow = (per_step(s) for s in final)
    base = [per_step(s) for s in baseline[0]]
    # The straggler's own compute is clearly the highest (8x the work; contention and fixed
    # per-step costs blur it).
    assert slow["compute"] > 1.5 * fast["compute"], (fast, slow)
    # The fast rank waits for it inside all-reduce: much more comm wait than in the baseline,
    # and much more than the straggler itself.
    assert fast["comm_wait"] > 3 * max(b["comm_wait"] for b in base), (fast, base)
    assert fast["comm_wait"] > 3 * slow["comm_wait"], (fast, slow)
    assert fast["comm_wait"] > 0.5 * (slow["compute"] - fast["compute"]), (fast, slow)


def test_comm_heavy_exposes_comm_wait(tmp_path: Path) -> None:
    final, _, _ = run_to_end([*SIZE, "--steps=15", "--comm-heavy"], tmp_path, 15)
    for s in final:
        assert shares(s)["comm_wait"] > 0.25, shares(s)


def test_hang_rank_stops_stepping_while_exporters_serve(tmp_path: Path) -> None:
    with torchrun_example(
        [*SIZE, "--steps=50", "--hang-rank=1", "--hang-after=5"],
        tmp_path,
        env=dict(contract.flight_recorder_env(set())),
    ) as run:
        final = run.wait_steps(5, TIMEOUT)
        wait_for("the hang", lambda: "hangs after 5 steps" in run.log() or None, TIMEOUT)
        # Both ranks are stuck at 5: rank 1 never starts step 6, rank 0 waits for it in
        # all-reduce. The endpoints still answer (stall detection needs them).
        again = [s.value("gpujob_train_steps_total") for s in run.wait_steps(5, TIMEOUT)]
        assert again == [5, 5]
        assert run.proc.poll() is None
        assert len(final) == 2
        # ... and so does their evidence: rank 0's recorder holds the pending all-reduce that
        # rank 1 never entered; rank 1's main thread sits where the example parks it.
        docs = [evidence_of(port) for port in run.ports()]
        pending = [e for e in docs[0]["collectives"]["entries"] if not e["retired"]]
        assert [e["op"] for e in pending] == ["all_reduce"]
        done = docs[1]["collectives"]["entries"]
        assert all(e["retired"] for e in done) and done[-1]["seq"] == pending[0]["seq"] - 1
        main = next(t for t in docs[1]["threads"] if t["main"])
        assert "hang" in [f["function"] for f in main["frames"]]


def test_first_step_checkpoint_and_eval_are_busy_phases_on_the_wire(tmp_path: Path) -> None:
    args = [
        *SIZE,
        "--steps=14",
        "--startup-seconds=2",
        "--checkpoint-every=4",
        "--checkpoint-seconds=2",
        "--eval-every=6",
        "--eval-seconds=2",
    ]
    phase = contract.CURRENT_PHASE.name

    def now_in(run: TrainerRun, name: str) -> tuple[int, Scrape] | None:
        for port in run.ports():
            try:
                s = scrape(port)
            except OSError:
                return None
            if s.get(phase, phase=name) == 1.0:
                return port, s
        return None

    with torchrun_example(args, tmp_path) as run:
        port, during = wait_for(
            "a rank in checkpoint", lambda: now_in(run, "checkpoint"), TIMEOUT, 0.05
        )
        assert sum(during.value(phase, phase=p) for p in contract.PHASES) == 1.0
        beat = during.value(contract.HEARTBEAT_TIMESTAMP.name)
        time.sleep(0.3)  # let the checkpoint run on a little (not a synchronisation)
        later = scrape(port)
        if later.get(phase, phase="checkpoint") == 1.0:  # no mark inside a busy phase
            assert later.value(contract.HEARTBEAT_TIMESTAMP.name) == beat
        wait_for("a rank in eval", lambda: now_in(run, "eval"), TIMEOUT, 0.05)
        final = run.wait_steps(14, TIMEOUT)
        assert run.end_linger() == 0, run.log()
    for s in final:
        ph = s.phases()
        # checkpoints after steps 4, 8, 12 and evaluations after 6 and 12, each inside the
        # span of the step that follows
        assert 5.8 < ph["checkpoint"] < 10.0, ph
        assert 3.8 < ph["eval"] < 7.0, ph
        assert s.value("gpujob_train_samples_total") == 14 * BATCH  # eval batches don't count
        assert ph["other"] > 1.8, ph  # the 2 s first-step delay (no phase of its own)


def evidence_of(port: int) -> dict[str, Any]:
    url = f"http://{LOOPBACK}:{port}{contract.EVIDENCE_PATH}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.loads(r.read()))
