"""Faults a hollow job's rank can be given, and which pods each one touches.

Pure. The fault file (``<cluster>/hollow/faults.json``, written by tests, the bench or
``gpujob_localcluster.cli hollow-fault``) lists faults by job and global rank:

    {"faults": [{"namespace": "ns", "job": "big", "rank": 13, "kind": "stall"}]}

- ``fail``: the rank's pod ends Failed (exit code 1), as a crashed trainer's would;
- ``stall``: every rank of the job stops stepping; the rank's stack is in its data loader and
  the others' in an all-reduce (a hang with a culprit);
- ``silent``: the rank's endpoints accept connections and never answer;
- ``straggle``: the job's ranks answer the recorded straggler condition, the rank as the slow one.

A fault holds for one gang attempt: the one named by ``attempt``, else the newest the kubelet
saw when the fault first appeared (or the first one after), so a restart clears it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, cast

FaultKind = Literal["fail", "stall", "silent", "straggle"]
KINDS: tuple[FaultKind, ...] = ("fail", "stall", "silent", "straggle")


@dataclass(frozen=True)
class RankFault:
    namespace: str
    job: str
    rank: int
    kind: FaultKind
    attempt: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.job}/{self.rank}/{self.kind}/{self.attempt or ''}"

    def pod_of_rank(self, nproc: int) -> int:
        """The node rank of the pod that runs the rank."""
        return self.rank // max(nproc, 1)


def parse(text: str) -> list[RankFault]:
    """The faults a file lists; a malformed entry raises ValueError naming it."""
    doc = json.loads(text) if text.strip() else {}
    out = []
    for i, raw in enumerate(doc.get("faults", [])):
        try:
            kind = raw["kind"]
            if kind not in KINDS:
                raise ValueError(f"kind {kind!r} is not one of {KINDS}")
            rank = int(raw["rank"])
            if rank < 0:
                raise ValueError("rank must be >= 0")
            attempt = raw.get("attempt")
            out.append(
                RankFault(
                    str(raw["namespace"]),
                    str(raw["job"]),
                    rank,
                    cast(FaultKind, kind),
                    None if attempt is None else str(attempt),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"faults[{i}]: {e}") from e
    return out


def render(faults: list[RankFault]) -> str:
    """The file's text for ``faults``."""
    rows = [
        {"namespace": f.namespace, "job": f.job, "rank": f.rank, "kind": f.kind}
        | ({"attempt": f.attempt} if f.attempt is not None else {})
        for f in faults
    ]
    return json.dumps({"faults": rows}, indent=1) + "\n"


def attempt_order(attempt: str) -> tuple[int, str]:
    """Attempt labels in the order the operator numbers them."""
    return (int(attempt), "") if attempt.isdigit() else (-1, attempt)


def job_mode(
    faults: list[RankFault], bound: dict[str, str], namespace: str, job: str, attempt: str
) -> tuple[FaultKind | None, int | None]:
    """What the endpoints of a pod of ``job`` at ``attempt`` answer: (fault, culprit rank);
    ``bound`` maps a fault's key to the attempt it holds for."""
    for f in faults:
        if f.kind == "fail" or f.namespace != namespace or f.job != job:
            continue
        if bound.get(f.key, f.attempt) == attempt:
            return f.kind, f.rank
    return None, None


def fails(
    faults: list[RankFault],
    bound: dict[str, str],
    namespace: str,
    job: str,
    attempt: str,
    node_rank: int,
    nproc: int,
) -> RankFault | None:
    """The ``fail`` fault that ends this pod, if any."""
    for f in faults:
        if f.kind != "fail" or f.namespace != namespace or f.job != job:
            continue
        if bound.get(f.key, f.attempt) == attempt and f.pod_of_rank(nproc) == node_rank:
            return f
    return None
