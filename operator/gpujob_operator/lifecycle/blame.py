"""Blamed nodes: what an ended attempt says about a node, and keeping the next attempts off it.

gpujob knows more than a restart does about *why* an attempt ended; this module acts on it.

* **Suspects.** While an attempt runs, every pass notes the node a published verdict names:
  a HardwareFault (an XID or uncorrected ECC error on one of its GPUs) or a Straggler (with
  when it was first published). They live in ``status.operatorState.suspects``, so a
  HardwareFault that the analyzer clears one window later still counts when the rank
  crashes minutes after it.
* **Blame.** When the attempt ends in a gang restart, the nodes it blames are: a
  HardwareFault suspect; a Straggler suspect that held ``runPolicy.avoidAfterWindows``
  windows; the node of the rank a stall's hang evidence names (``restartOnStall``); the node
  of a pod the taint manager evicted (the node went NotReady); the node of the failed rank
  when its log or termination message reads as a GPU fault (``uncorrectable ECC error``,
  ``fallen off the bus``, ``GPU is lost``, ``Xid``). Each goes to ``status.gang.avoidedNodes``
  with its reason, message, attempt and expiry (``runPolicy.avoidSeconds``).
* **Avoidance.** The next attempts' pods get required node affinity ``metadata.name NotIn``
  for each avoided node, added to every term of the user's own. Never so many that the gang
  cannot fit: against the nodes the shell read (:class:`NodeView`) the newest, least severe
  exclusions are dropped until the pods fit again, and condition ``NodesAvoided`` turns
  False (``TooFewNodes``) with a Warning. When no node could be read the pods go anywhere
  (``NodesUnknown``): a gang the operator made unschedulable would wait for ever.

Pure: plain dicts in and out; the shell reads the nodes (cached, for the whole operator).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from gpujob_operator.api import conditions as c
from gpujob_operator.api.quantity import parse_quantity
from gpujob_operator.lifecycle.forecast.queueview import fits_node
from gpujob_operator.lifecycle.gang import podholds
from gpujob_operator.lifecycle.observations import ObservedPod
from gpujob_trainer import contract

HARDWARE_FAULT: Final = "HardwareFault"
STALLED: Final = "Stalled"
STRAGGLER: Final = "Straggler"
NODE_NOT_READY: Final = "NodeNotReady"
PREFLIGHT: Final = "Preflight"

SUSPECT_VERDICTS: Final = frozenset({HARDWARE_FAULT, STRAGGLER})
"""Published verdicts whose node is noted while the attempt runs."""
MAX_SUSPECTS: Final = 16
"""``operatorState.suspects`` holds at most this many (the CRD's maxItems)."""
MAX_AVOIDED: Final = 32
"""``status.gang.avoidedNodes`` holds at most this many (the CRD's maxItems)."""
SEVERITY: Final = {STRAGGLER: 0, NODE_NOT_READY: 1, STALLED: 2, PREFLIGHT: 3, HARDWARE_FAULT: 4}
"""When the gang cannot fit, exclusions are given up least severe first."""
TAINT_MANAGER: Final = "DeletionByTaintManager"
"""The DisruptionTarget reason of a pod evicted from a NotReady or unreachable node."""
GPU_FAULT: Final = re.compile(
    r"uncorrectable ECC error|fallen off the bus|GPU is lost|\bXid\b", re.IGNORECASE
)
"""What a rank's log or termination message says when its GPU failed under it."""
MESSAGE_MAX: Final = 1024


@dataclass(frozen=True)
class NodeView:
    """The cluster's nodes as the shell read them (name, labels, taints, allocatable), or
    why it could not."""

    nodes: Sequence[Mapping[str, Any]] = ()
    error: str | None = None


def _clip(text: str) -> str:
    return c.clip(text, MESSAGE_MAX)


def failure_text(failure: Mapping[str, Any]) -> str:
    """``status.failure``'s words: its message and its log tail, where a rank says why."""
    return f"{failure.get('message') or ''}\n{failure.get('logTail') or ''}"


# ---- suspects ------------------------------------------------------------------------------


def suspects(status: Mapping[str, Any], attempt: int, now: datetime) -> list[dict[str, Any]]:
    """The suspects of ``attempt``, the attempt ``status`` (as read this pass) describes.

    A suspect's time is kept in spells: ``since`` opens one when a pass first sees the
    verdict name the node, the first pass that no longer sees it adds the spell to
    ``heldSeconds`` and closes it. So the status changes only when a verdict comes or goes
    (never on every pass), a gap is not counted as held, and a verdict that moved to
    another node does not lend that node its start.
    """
    state = status.get("operatorState") or {}
    out = [
        dict(s)
        for s in state.get("suspects") or []
        if isinstance(s, Mapping) and s.get("attempt") == attempt
    ]
    b = status.get("bottleneck") or {}
    node, verdict = b.get("node"), b.get("verdict")
    live = (
        (node, verdict) if isinstance(node, str) and node and verdict in SUSPECT_VERDICTS else None
    )
    stamp = c.format_time(now)
    for s in out:
        if (s.get("node"), s.get("verdict")) == live:
            if not s.get("since"):
                s["since"] = stamp
            live = None
        elif s.get("since"):
            began = c.time_or_none(s.get("since"))
            held = max(0.0, (now - began).total_seconds()) if began is not None else 0.0
            s["heldSeconds"] = round(float(s.get("heldSeconds") or 0) + held)
            s.pop("since", None)
    if live is None:
        return out
    new = {
        "node": live[0],
        "verdict": live[1],
        "attempt": attempt,
        "since": stamp,
        "summary": _clip(str(b.get("summary") or live[1])),
    }
    # Full: a HardwareFault is never pushed out by a Straggler.
    while len(out) >= MAX_SUSPECTS:
        weakest = min(range(len(out)), key=lambda i: SEVERITY.get(str(out[i].get("verdict")), 0))
        if SEVERITY.get(str(out[weakest].get("verdict")), 0) > SEVERITY[str(live[1])]:
            return out
        out.pop(weakest)
    out.append(new)
    return out


# ---- blame at the end of an attempt --------------------------------------------------------


def _windows_held(s: Mapping[str, Any], window_seconds: float, now: datetime | None) -> float:
    """Windows a suspect held: its closed spells, and the open one up to ``now``."""
    held = float(s.get("heldSeconds") or 0)
    began = c.time_or_none(s.get("since"))
    if began is not None and now is not None:
        held += max(0.0, (now - began).total_seconds())
    return held / window_seconds if window_seconds > 0 else 0.0


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as far as blame goes."""

    suspects: Sequence[Mapping[str, Any]] = ()
    window_seconds: float = 0.0
    """The analysis window (a Straggler's hold is counted in these)."""
    after_windows: int = 1
    """runPolicy.avoidAfterWindows."""
    evidence: Mapping[str, Any] | None = None
    """The hang evidence of a stall that restarts the gang (restartOnStall)."""
    failure: Mapping[str, Any] | None = None
    """``status.failure`` of the failed rank, with its log tail."""
    failed: ObservedPod | None = None
    disrupted: ObservedPod | None = None
    now: datetime | None = None
    """When the attempt ends: a spell still open held until then."""
    preflights: Sequence[ObservedPod] = ()
    """Every pod of the attempt whose pre-flight check failed (exit code
    :data:`~gpujob_trainer.contract.PREFLIGHT_EXIT_CODE`), not only the first."""


def preflight_line(exit_code: Any, text: str) -> str | None:
    """The line a failed pre-flight check names its node in, or None: only with its exit
    code, so a user's script printing the same words blames nothing."""
    if exit_code != contract.PREFLIGHT_EXIT_CODE:
        return None
    named = f"{contract.PREFLIGHT_MARK} FAILED on node"
    lines = [ln.strip() for ln in text.splitlines() if named in ln]
    return lines[-1] if lines else None


def blamed(end: Ending) -> list[tuple[str, str, str]]:
    """(node, reason, message) for each node the ending attempt blames, most severe first."""
    found: dict[str, tuple[str, str]] = {}

    def add(node: str | None, reason: str, message: str) -> None:
        if not node:
            return
        old = found.get(node)
        if old is None or SEVERITY[reason] > SEVERITY[old[0]]:
            found[node] = (reason, _clip(message))

    for s in end.suspects:
        node, verdict = s.get("node"), s.get("verdict")
        if verdict == HARDWARE_FAULT:
            add(node, HARDWARE_FAULT, str(s.get("summary") or verdict))
        elif verdict == STRAGGLER:
            held = _windows_held(s, end.window_seconds, end.now)
            if held >= end.after_windows:
                add(node, STRAGGLER, f"{s.get('summary') or verdict} (held {held:.1f} windows)")
    if end.evidence is not None:
        ev = end.evidence
        add(ev.get("node"), STALLED, str(ev.get("summary") or "the rank the hang evidence named"))
    disrupted, failure, failed = end.disrupted, end.failure, end.failed
    if disrupted is not None and disrupted.disruption == TAINT_MANAGER:
        detail = f": {disrupted.disruption_message}" if disrupted.disruption_message else ""
        evicted = f"pod {disrupted.name} was evicted from its node ({TAINT_MANAGER}{detail})"
        add(disrupted.node_name, NODE_NOT_READY, evicted)
    checks = [(p, p.exit_code, p.message or "") for p in end.preflights]
    if failure is not None and failed is not None:
        text = failure_text(failure)
        checks.append((failed, failure.get("exitCode"), text))
        hit = GPU_FAULT.search(text)
        if hit is not None:
            line = next((ln for ln in text.splitlines() if hit.group(0) in ln), hit.group(0))
            fault = f"pod {failed.name} failed with a GPU fault: {line.strip()}"
            add(failed.node_name, HARDWARE_FAULT, fault)
    for pod, code, said in checks:
        named = preflight_line(code, said)
        if named is not None:
            add(pod.node_name, PREFLIGHT, named)
    return sorted(((n, r, m) for n, (r, m) in found.items()), key=lambda t: (-SEVERITY[t[1]], t[0]))


def record(
    avoided: Sequence[Mapping[str, Any]],
    found: Sequence[tuple[str, str, str]],
    attempt: int,
    now: datetime,
    seconds: float,
) -> list[dict[str, Any]]:
    """``status.gang.avoidedNodes`` with what attempt ``attempt`` blamed first, at most
    :data:`MAX_AVOIDED`. A node blamed again gets the new expiry and keeps the more severe
    of its reasons (a HardwareFault never turns into a Straggler, first to be given back)."""
    expires = c.format_time(now + timedelta(seconds=seconds))
    old = {str(a.get("node")): a for a in avoided}
    new = []
    when = {"attempt": attempt, "since": c.format_time(now), "expires": expires}
    for node, reason, message in found:
        was = old.get(node)
        if was is not None and SEVERITY.get(str(was.get("reason")), 0) > SEVERITY[reason]:
            new.append({**dict(was), **when})
        else:
            new.append({"node": node, "reason": reason, "message": message, **when})
    fresh = {node for node, _, _ in found}
    return (new + [dict(a) for a in avoided if a.get("node") not in fresh])[:MAX_AVOIDED]


def active(avoided: Sequence[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The entries not yet expired (one without a readable expiry is kept: never lost)."""
    out = []
    for a in avoided:
        until = c.time_or_none(a.get("expires"))
        if until is None or until > now:
            out.append(dict(a))
    return out


# ---- placement -----------------------------------------------------------------------------


def holds(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], needed: int
) -> dict[str, int]:
    """How many of the gang's pods each node the pod may go to holds by its allocatable
    resources (its load aside), at most ``needed``; nodes holding none are left out. One
    pass over the nodes, whatever is excluded later."""
    spec = pod.get("spec") or {}
    wants = {k: v for k, v in podholds.requests(pod).items() if v > 0}
    out: dict[str, int] = {}
    for node in nodes:
        if not fits_node(spec, node):
            continue
        alloc = (node.get("status") or {}).get("allocatable") or {}
        most = needed
        for name, want in wants.items():
            have = parse_quantity(alloc.get(name)) if isinstance(alloc, Mapping) else None
            most = 0 if have is None or have <= 0 else min(most, math.floor(have / want))
            if most == 0:
                break
        if most > 0:
            out[str((node.get("metadata") or {}).get("name") or "")] = most
    return out


def capacity(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
             excluded: frozenset[str], needed: int) -> int:  # fmt: skip
    """How many of the gang's pods the nodes not excluded hold, capped at ``needed``."""
    return _without(holds(pod, nodes, needed), excluded, needed)


def _without(
    counts: Mapping[str, int], excluded: Sequence[str] | frozenset[str], needed: int
) -> int:
    total = sum(counts.values()) - sum(counts.get(n, 0) for n in set(excluded))
    return min(total, needed)


@dataclass(frozen=True)
class Placement:
    """The nodes the attempt's pods are kept off, and the NodesAvoided condition saying so."""

    excluded: tuple[str, ...]
    status: c.ConditionStatus
    reason: str
    message: str


def placement(
    avoided: Sequence[Mapping[str, Any]],
    pod: Mapping[str, Any],
    needed: int,
    view: NodeView | None,
    attempt: int,
) -> Placement | None:
    """Where attempt ``attempt`` may go: None when nothing is avoided."""
    if not avoided:
        return None
    ranked = sorted(
        avoided, key=lambda a: (-SEVERITY.get(str(a.get("reason")), 0), str(a.get("since") or ""))
    )
    names = [str(a["node"]) for a in ranked]

    def listed(nodes: Sequence[str]) -> str:
        by = {str(a["node"]): a for a in ranked}
        return ", ".join(f"{n} ({by[n].get('reason')} until {by[n].get('expires')})" for n in nodes)

    if view is None or view.error is not None:
        why = view.error if view is not None and view.error else "the nodes were not read"
        return Placement(
            (),
            c.FALSE,
            c.NODES_UNKNOWN,
            f"attempt {attempt} cannot check that its {needed} pods fit without the blamed "
            f"nodes {listed(names)} ({why}); placing them on any node",
        )
    counts = holds(pod, view.nodes, needed)
    whole = _without(counts, (), needed)
    if whole < needed:
        # The gang does not fit even on every node (capacity still to come): exclusions do
        # not decide whether it starts, so keep them.
        return Placement(
            tuple(names),
            c.TRUE,
            c.BLAMED_NODES_AVOIDED,
            f"attempt {attempt} avoids {listed(names)}; only {whole} of its {needed} pods fit "
            f"on the cluster's nodes even with them",
        )
    keep = list(names)
    while keep and _without(counts, keep, needed) < needed:
        keep.pop()  # the least severe, most recent last
    if len(keep) == len(names):
        return Placement(
            tuple(keep), c.TRUE, c.BLAMED_NODES_AVOIDED, f"attempt {attempt} avoids {listed(keep)}"
        )
    dropped = [n for n in names if n not in keep]
    kept = f"; still avoids {listed(keep)}" if keep else ""
    return Placement(
        tuple(keep),
        c.FALSE,
        c.TOO_FEW_NODES,
        f"attempt {attempt}'s {needed} pods do not fit without {listed(dropped)}: placing "
        f"them there anyway{kept}",
    )


def exclude(pod: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """The pod with required node affinity ``metadata.name NotIn`` each node, added to every
    term of its own required node affinity (a term is one way to qualify; each must now
    also avoid the nodes)."""
    if not nodes:
        return pod
    out = copy.deepcopy(pod)
    spec = out.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    avoid = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in nodes]
    required["nodeSelectorTerms"] = [
        {**t, "matchFields": [*(t.get("matchFields") or []), *avoid]} for t in terms
    ]
    return out
