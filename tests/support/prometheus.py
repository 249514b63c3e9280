"""A real Prometheus for tests, and a fake-GPU trainer that feeds it every contract series.

:class:`Prometheus` runs the Debian package's binary on 127.0.0.1 with a temp config and
storage, and answers queries through the HTTP API. :func:`fake_trainer_main` is what the
pods of a test job run: per local rank, a real :class:`gpujob_trainer.Tracker` driven by a
tiny loop and served by the real exporter collectors, with the NVML collector given a fake
NVML (the collector's injection point) and the CUDA allocator collector given fake
``memory_stats``. So the GPU series come from the production code paths, only the driver is
fake. This module is imported by those pod processes: keep its imports light.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.waiting import wait_until

PROMETHEUS_BIN = os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus")
PROMTOOL_BIN = str(Path(PROMETHEUS_BIN).parent / "promtool")
REPO = Path(__file__).resolve().parents[2]


def require_binaries() -> None:
    """Fail (never skip) with the fix when Prometheus is not installed."""
    for b in (PROMETHEUS_BIN, PROMTOOL_BIN):
        if not (Path(b).exists() and os.access(b, os.X_OK)):
            raise AssertionError(
                f"{b} is missing: run `make prometheus` (hack/ensure-prometheus.sh)"
            )


def promtool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    require_binaries()
    return subprocess.run([PROMTOOL_BIN, *args], capture_output=True, text=True, timeout=timeout)


class QueryError(RuntimeError):
    """Prometheus answered a query with an error (bad PromQL, evaluation failure)."""


@dataclass
class Prometheus:
    """One Prometheus process with its own config and TSDB under ``folder``."""

    folder: Path
    config: dict[str, Any]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.folder / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Prometheus:
        require_binaries()
        self.folder.mkdir(parents=True, exist_ok=True)
        cfg = self.folder / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config, sort_keys=False))
        check = promtool("check", "config", str(cfg))
        assert check.returncode == 0, f"promtool check config: {check.stdout}{check.stderr}"
        out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                PROMETHEUS_BIN,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        wait_until(self._ready, timeout, f"Prometheus ready (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns ``data``; raises :class:`QueryError` on an API error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query at now: the result vector (scalars become one unlabelled sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]


# ---- the fake-GPU trainer run by the test job's pods ------------------------------------------


def fake_trainer_main() -> None:
    """One pod of the test job: ``PET_NPROC_PER_NODE`` ranks, each with its own exporter.

    The loop sleeps to stand in for work (it is the workload, not synchronisation) and runs
    until the pod is deleted (SIGTERM) or ``GPUJOB_TOTAL_STEPS`` steps are done.
    """
    import threading
    import time

    from prometheus_client import CollectorRegistry

    from gpujob_trainer import contract
    from gpujob_trainer.cuda_memory import CudaMemoryCollector
    from gpujob_trainer.env import RankInfo, metrics_addr, metrics_base_port, total_steps_from_env
    from gpujob_trainer.exporter import Exporter, TrainerCollector
    from gpujob_trainer.nvml import NvmlCollector
    from gpujob_trainer.tracker import Tracker

    node_rank = int(os.environ.get("PET_NODE_RANK", os.environ.get("RANK", "0")))
    nproc = int(os.environ.get("PET_NPROC_PER_NODE", "1"))
    world = int(os.environ.get("PET_NNODES", "1")) * nproc
    total = total_steps_from_env() or 10**9
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    gpus = [
        FakeGpu(
            f"GPU-{node_rank:08d}-0000-0000-0000-{i:012d}", reasons=0x4
        )  # sw power cap: throttling panel shows 1
        for i in range(nproc)
    ]

    def rank_loop(local_rank: int) -> None:
        rank = RankInfo(
            rank=node_rank * nproc + local_rank,
            local_rank=local_rank,
            node_rank=node_rank,
            world_size=world,
        )
        tracker = Tracker(
            total_steps=total,
            rank=rank,
            hook_optimizers=False,
            flops_per_sample=1e9,  # MFU panels: 32e9 FLOPs a step against a given peak
            peak_tflops=100.0,
        )
        tracker.devices = (gpus[local_rank].uuid,)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TrainerCollector(tracker))
        stats = {"reserved_bytes.all.current": 20 * 2**30, "num_alloc_retries": 0, "num_ooms": 0}
        gpu = gpus[local_rank]
        registry.register(CudaMemoryCollector(rank, stats=lambda: (gpu.uuid, stats)))
        if local_rank == 0:
            registry.register(NvmlCollector(node_rank=node_rank, nvml=FakeNvml(gpus)))
        port = contract.metrics_port(metrics_base_port(), local_rank)
        exporter = Exporter(registry, port, metrics_addr())
        exporter.start()
        slow = 1.0 + 0.5 * rank.rank  # later ranks compute longer: the straggler panels differ
        # The ranks are threads of one process without a torch model, so no real capture can
        # run here (tests/trainer/test_profile_capture.py runs one): the latest profile's
        # parts are set as a finished capture leaves them, for the profile panel's data.
        tracker.profiler.latest_parts = {
            "compute": 0.03 * slow, "communication": 0.005, "copy": 0.002, "idle": 0.004,
        }  # fmt: skip
        step = 0
        while not stop.is_set() and step < total:
            with tracker.phase(contract.PHASE_DATA_WAIT):
                time.sleep(0.004)
            with tracker.transfer():
                time.sleep(0.002)
            with tracker.phase(contract.PHASE_FORWARD):
                time.sleep(0.01 * slow)
            with tracker.phase(contract.PHASE_BACKWARD):
                time.sleep(0.02 * slow)
            with tracker.phase(contract.PHASE_COMM_WAIT):
                time.sleep(0.005)
            with tracker.phase(contract.PHASE_OPTIMIZER):
                time.sleep(0.003)
            tracker.end_step()
            tracker.log(loss=2.0 / (1 + step / 100), samples=32, epoch=step // 1000)
            step += 1
        exporter.stop()

    threads = [threading.Thread(target=rank_loop, args=(i,), daemon=True) for i in range(nproc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
