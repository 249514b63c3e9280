"""What a framework training script run by the integration tests leaves behind: each rank,
when its training ends and while its exporter still serves, writes its own /metrics text and
the framework's own numbers to `<out>/rank<R>.json`; with `hold`, it then waits for
`<out>/release` (the test runs `gpujob diagnose` against the live endpoint meanwhile)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpujob_trainer import contract, env

HOLD_SECONDS = 180.0
"""How long a held rank waits for the test's release before it goes on by itself."""


def report(out: Path, facts: dict[str, Any], hold: bool) -> None:
    """Write this rank's metrics and `facts` atomically; then hold if asked."""
    rank = env.RankInfo.from_env()
    port = contract.metrics_port(env.metrics_base_port(), rank.local_rank)
    addr = env.metrics_addr()  # a pod of the local cluster serves on its own 127.x address
    host = "127.0.0.1" if addr in ("0.0.0.0", "::") else addr
    url = f"http://{host}:{port}{contract.METRICS_PATH}"
    with urllib.request.urlopen(url, timeout=10) as response:
        metrics = response.read().decode()
    path = out / f"rank{rank.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**facts, "metrics": metrics, "port": port}))
    os.replace(tmp, path)
    if hold:
        deadline = time.monotonic() + HOLD_SECONDS
        while not (out / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # poll interval while the test diagnoses this rank
