"""A profile capture on a real torchrun (issue 41): 2 CPU ranks (gloo), asked over HTTP.

The workload is one large matmul per layer (`--hidden=1024 --layers=1`, 4096 rows a step), so
the summary's top operation must be that matmul (aten::addmm forward, aten::mm backward): each
is several times the gloo all-reduce of its 4 MiB gradient, peer waits included. Synchronisation is by
polling the rank's own state with a deadline; the checks compare a value with itself (the
parts add up, the trace's own step annotations), never two timings that load could reorder.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import LOOPBACK, scrape, torchrun_example, wait_for

from gpujob_trainer import contract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SIZE = ["--hidden=1024", "--layers=1", "--batch-size=4096", "--steps=1000000"]
STEPS = 5
DEADLINE = 150.0  # startup and 5 steps: ~15 s idle, more on a loaded 2-core machine


def profile(port: int, query: str = "") -> tuple[int, dict[str, Any]]:
    url = f"http://{LOOPBACK}:{port}{contract.PROFILE_PATH}{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Type"] == "application/json"
            return r.status, dict(json.loads(r.read()))
    except urllib.error.HTTPError as err:
        assert err.headers["Content-Type"] == "application/json"
        return err.code, dict(json.loads(err.read()))


def test_a_capture_of_five_steps_on_both_ranks(tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    env = {contract.ENV_PROFILE_DIR: str(out)}
    with torchrun_example(SIZE, tmp_path, env=env) as run:
        ports = run.ports()
        wait_for(
            "3 steps on every rank",
            lambda: all((scrape(p).get(contract.STEPS.name) or 0) >= 3 for p in ports) or None,
            DEADLINE,
        )
        # Bad requests: refused with why, nothing started.
        assert profile(ports[0], "?id=x&steps=0")[0] == 400
        assert profile(ports[0], f"?id=x&steps={contract.PROFILE_MAX_STEPS + 1}")[0] == 400
        assert profile(ports[0], "?id=bad/id&steps=5")[0] == 400
        assert profile(ports[0], "?steps=5")[0] == 400
        status, idle = profile(ports[0])
        assert status == 200 and idle["state"] == "idle" and idle["id"] is None

        first = [profile(p, f"?id=t1&steps={STEPS}") for p in ports]
        for rank, (status, doc) in enumerate(first):
            assert status == 200
            assert doc["version"] == 1 and doc["rank"] == rank and doc["id"] == "t1"
            assert doc["state"] == "pending" and doc["steps"] == STEPS
        # Another id while t1 is in flight (5 steps of a large matmul take a second or more).
        busy = [profile(p, "?id=t2&steps=3")[1] for p in ports]
        for doc in busy:
            assert doc["state"] == "busy" and doc["busyWith"] == "t1", doc

        def finished() -> list[dict[str, Any]] | None:
            docs = [profile(p, f"?id=t1&steps={STEPS}")[1] for p in ports]  # polling: same call
            return docs if all(d["state"] in ("done", "failed") for d in docs) else None

        try:
            docs = wait_for("both captures done", finished, DEADLINE, interval=0.25)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- trainer log ---\n{run.log()}") from exc
        scrapes = [scrape(p) for p in ports]

    for rank, doc in enumerate(docs):
        assert doc["state"] == "done", doc
        assert doc["error"] is None and doc["stepsDone"] == STEPS
        assert doc["startedAt"] >= doc["requestedAt"] and doc["finishedAt"] >= doc["startedAt"]
        # The trace: where the contract says, torch's chrome trace JSON, one event per step.
        trace = Path(doc["trace"])
        assert trace == out.resolve() / f"local-rank{rank}-t1.pt.trace.json"
        assert doc["traceBytes"] == trace.stat().st_size
        loaded = json.loads(trace.read_text())
        assert isinstance(loaded["traceEvents"], list)
        steps = sorted(
            (
                e
                for e in loaded["traceEvents"]
                if str(e.get("name", "")).startswith("ProfilerStep#")
            ),
            key=lambda e: e["ts"],
        )
        assert [e["name"] for e in steps] == [f"ProfilerStep#{k}" for k in range(STEPS)]
        assert all(e["ph"] == "X" and e["dur"] > 0 for e in steps)

        s = doc["summary"]
        assert s["version"] == 1 and s["rank"] == rank and s["steps"] == STEPS
        assert s["device"] == "cpu"
        assert len(json.dumps(s)) <= 16 * 1024
        # The parts are exclusive and add up to the step time.
        assert set(s["parts"]) == set(contract.PROFILE_PARTS)
        assert all(v >= 0 for v in s["parts"].values())
        assert sum(s["parts"].values()) == pytest.approx(s["stepSeconds"], rel=1e-6)
        # The step time is the trace's own: its window over the steps, the steps' mean.
        window = (steps[-1]["ts"] + steps[-1]["dur"] - steps[0]["ts"]) / 1e6
        assert s["stepSeconds"] == pytest.approx(window / STEPS, rel=1e-6)
        assert s["stepsSeconds"] == pytest.approx([e["dur"] / 1e6 for e in steps], rel=1e-6)
        assert sum(s["stepsSeconds"]) / STEPS == pytest.approx(s["stepSeconds"], rel=0.10)
        # ...and of the size the tracker measures (a loose bound: the profiler adds its cost,
        # and the tracker's mean also holds the steps before and after the capture).
        sc = scrapes[rank]
        tracker_step = sc.value(contract.STEP_DURATION.name + "_sum") / sc.value(
            contract.STEP_DURATION.name + "_count"
        )
        assert tracker_step / 5 < s["stepSeconds"] < tracker_step * 5
        # One large matmul per layer: it is where the step goes.
        top = s["top"]
        assert 1 <= len(top) <= 10
        assert top[0]["name"] in ("aten::addmm", "aten::mm"), top
        assert top[0]["kind"] == "compute"
        assert s["parts"]["compute"] > 0
        seconds = [op["seconds"] for op in top]
        assert seconds == sorted(seconds, reverse=True)
        # The gauge shows the same parts.
        for part in contract.PROFILE_PARTS:
            got = sc.value(contract.PROFILE_STEP_SECONDS.name, rank=str(rank), part=part)
            assert got == pytest.approx(s["parts"][part])
