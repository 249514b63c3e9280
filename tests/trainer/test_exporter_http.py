"""The exporter over real HTTP on loopback: private registry, no `_created`, clean stop."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from trainer_harness import LOOPBACK, scrape

import gpujob_trainer
from gpujob_trainer import contract, evidence
from gpujob_trainer.env import RankInfo


def test_exporter_serves_the_contract_and_stops() -> None:
    tracker = gpujob_trainer.init(
        total_steps=5, port=0, addr=LOOPBACK, rank=RankInfo(1, 1, 0, 2), gpu_telemetry=True
    )
    try:
        assert tracker.exporter is not None
        port = tracker.exporter.port
        assert port > 0
        with tracker.phase("checkpoint"):
            pass
        tracker.end_step()
        tracker.log(loss=0.5, samples=16)
        s = scrape(port)
        assert "_created" not in s.text
        labels = {"rank": "1", "local_rank": "1", "node_rank": "0"}
        assert s.value("gpujob_train_steps_total", **labels) == 1
        assert s.value("gpujob_train_target_steps", **labels) == 5
        assert s.value("gpujob_train_samples_total", **labels) == 16
        assert s.value("gpujob_train_loss", **labels) == 0.5
        assert s.value("gpujob_train_step_duration_seconds_count", **labels) == 1
        assert s.types["gpujob_train_step_duration_seconds"] == "histogram"
        assert s.types["gpujob_train_phase_seconds"] == "counter"
        # no NVML on this machine: the availability gauge says so, no GPU series
        assert s.value("gpujob_gpu_telemetry_available") == 0
        assert not [n for n in s.names() if n.startswith("gpujob_gpu_") and "telemetry" not in n]
        # our registry only: nothing of prometheus_client's default process/platform series
        assert all(n.startswith("gpujob_") for n in s.names())
        assert set(s.types) <= {m.family for m in contract.ALL_METRICS}
    finally:
        tracker.close()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=2)


def test_not_started_at_import_or_construction() -> None:
    tracker = gpujob_trainer.Tracker(rank=RankInfo())
    assert tracker.exporter is None
    tracker.close()


def test_port_in_use_is_logged_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        tracker = gpujob_trainer.init(port=port, addr=LOOPBACK, rank=RankInfo())
        assert tracker.exporter is None
        assert "metrics exporter not started" in caplog.text
        with pytest.raises(OSError):
            tracker.start_exporter(port, LOOPBACK)
        tracker.end_step()
        assert tracker.snapshot().steps == 1
        tracker.close()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())


def test_the_evidence_endpoint_serves_every_threads_stack_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json
    import threading

    parked = threading.Event()

    def park_here() -> None:  # a thread whose place the evidence must show
        parked.wait(30)

    worker = threading.Thread(target=park_here, name="parked", daemon=True)
    worker.start()
    tracker = gpujob_trainer.init(port=0, addr=LOOPBACK, rank=RankInfo(3, 0, 1, 4))
    try:
        assert tracker.exporter is not None
        status, body = _get(tracker.exporter.port, contract.EVIDENCE_PATH)
        assert status == 200
        doc = json.loads(body)
        assert doc["rank"] == 3 and doc["version"] == 1
        threads = {t["name"]: t for t in doc["threads"]}
        assert "park_here" in [f["function"] for f in threads["parked"]["frames"]]
        assert threads["MainThread"]["main"]
        serving = [f["function"] for t in doc["threads"] for f in t["frames"]]
        assert "stacks" not in serving, "the thread taking the stacks is left out"
        # no process group in this process: said, not guessed
        assert doc["collectives"]["available"] is False and doc["collectives"]["why"]
    finally:
        tracker.close()
        parked.set()

    monkeypatch.setenv(contract.ENV_EVIDENCE, "0")
    tracker = gpujob_trainer.init(port=0, addr=LOOPBACK, rank=RankInfo(0, 0, 0, 1))
    try:
        assert tracker.exporter is not None
        status, body = _get(tracker.exporter.port, contract.EVIDENCE_PATH)
        assert status == 404 and b"GPUJOB_EVIDENCE=0" in body
        assert _get(tracker.exporter.port, contract.METRICS_PATH)[0] == 200
    finally:
        tracker.close()


def test_with_a_token_the_evidence_answers_only_a_request_that_presents_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(contract.ENV_ENDPOINT_TOKEN, "s3cret-token")
    taken: list[int | None] = []
    monkeypatch.setattr(evidence, "render", lambda rank: taken.append(rank) or b"{}")
    tracker = gpujob_trainer.init(port=0, addr=LOOPBACK, rank=RankInfo(0, 0, 0, 1))
    try:
        assert tracker.exporter is not None
        port = tracker.exporter.port
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Bearer s3cret-token-and-more"},
            {"Authorization": "s3cret-token"},
        ):
            status, body = _get(port, contract.EVIDENCE_PATH, headers)
            assert (status, body) == (401, b"this path needs the job's endpoint token\n"), headers
        assert _get(port, "/debug/anything-else")[0] == 401
        assert taken == [], "a refused request made the rank collect its evidence"
        good = {"Authorization": "Bearer s3cret-token"}
        assert _get(port, contract.EVIDENCE_PATH, good) == (200, b"{}")
        assert taken == [0]
        # /metrics stays open: the PodMonitor's Prometheus has no per-job token
        assert _get(port, contract.METRICS_PATH)[0] == 200
    finally:
        tracker.close()


def test_without_a_token_the_evidence_stays_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_ENDPOINT_TOKEN, raising=False)
    tracker = gpujob_trainer.init(port=0, addr=LOOPBACK, rank=RankInfo(0, 0, 0, 1))
    try:
        assert tracker.exporter is not None
        assert _get(tracker.exporter.port, contract.EVIDENCE_PATH)[0] == 200
    finally:
        tracker.close()
