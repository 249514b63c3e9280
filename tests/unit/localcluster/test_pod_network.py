"""Each node agent on a machine hands out pod addresses from a second octet of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpujob_localcluster import agent


def test_two_live_agents_never_share_a_pod_network_and_a_dead_ones_is_free_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent, "POD_NETWORKS", tmp_path)
    # Another process holds every octet but one (as other clusters' agents would).
    held = subprocess.Popen(
        [
            sys.executable, "-c",
            "import fcntl, sys\n"
            f"fs = [open('{tmp_path}/%d.lock' % i, 'ab') for i in range(2, 201)]\n"
            "[fcntl.flock(f, fcntl.LOCK_EX) for f in fs]\n"
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        first, lock = agent.claim_pod_network()
        assert first == 1
        with pytest.raises(RuntimeError, match="every pod network"):
            agent.claim_pod_network()  # a second agent in this process too is kept apart
        lock.close()
        again, lock = agent.claim_pod_network()
        assert again == 1
        lock.close()
    finally:
        assert held.stdin is not None
        held.stdin.close()
        held.wait(timeout=30)
    # The holder is gone: its octets are free, whatever files it left.
    claims = [agent.claim_pod_network() for _ in range(3)]
    assert len({n for n, _ in claims}) == 3
    for _, f in claims:
        f.close()
