"""A profile asked of a job's ranks: the request annotation, and what to do about it (pure).

The request is the annotation ``gpujob.dev/profile`` on the GPUTrainingJob (``gpujob
profile`` sets it; ``kubectl annotate`` works the same), value ``steps=5;ranks=all;id=X``:
each part optional, in any order, at most once. ``steps`` 1..``PROFILE_MAX_STEPS`` (default
``PROFILE_DEFAULT_STEPS``); ``ranks`` ``all``, ``slowest`` (the default: the ranks the
verdict's breakdown names slowest and median, else all) or a comma list ``0,13``; ``id``
``[A-Za-z0-9._-]{1,64}`` (default: made from the value and the time it was seen).

A request is new when the value differs from the last one the status acknowledged
(``status.profile.request``, or ``status.profile.refused.request`` for one refused while a
capture ran). :func:`decide` says what the runtime does with the job each pass: nothing,
refuse (with the record to write), start a capture, or resume one the status says is under
way but this operator does not run (it restarted; the ranks' endpoint is idempotent by id).
:func:`auto_request` is ``spec.monitoring.profileOnVerdict``: once per attempt while a
Warning verdict is published (it held for its hysteresis).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from gpujob_operator.api.names import PROFILE_ANNOTATION, PROFILE_DEFAULT_DIR
from gpujob_operator.api.spec import GPUTrainingJobSpec, parse_spec
from gpujob_operator.api.status import attempt_of
from gpujob_trainer import contract

MAX_VALUE: Final = 256
"""Characters of an annotation value the operator reads (``status.profile.request``'s cap)."""
MAX_RANKS: Final = 256
"""Ranks one capture asks (bounded as hang evidence is); ``all`` on a larger job is refused."""
ID_PATTERN: Final = contract.PROFILE_ID
IN_FLIGHT: Final = ("Requested", "Capturing")
"""``status.profile.state`` values of a capture under way."""
DONE: Final = ("Captured", "Failed", "Refused")
RanksChoice = Literal["all", "slowest"] | tuple[int, ...]


@dataclass(frozen=True)
class Request:
    """A parsed request: how many steps, which ranks, its id ("" : not given)."""

    value: str
    steps: int = contract.PROFILE_DEFAULT_STEPS
    ranks: RanksChoice = "slowest"
    id: str = ""


def parse_request(value: str) -> Request | str:
    """The annotation value as a :class:`Request`, or why it is refused (one sentence)."""
    if not isinstance(value, str):
        return "the request must be a string"
    if len(value) > MAX_VALUE:
        return f"the request is {len(value)} characters long; at most {MAX_VALUE}"
    seen: dict[str, str] = {}
    for raw in value.split(";"):
        part = raw.strip()
        if not part:
            continue
        key, sep, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if not sep:
            return f"{_quote(part)} is not key=value (keys: steps, ranks, id)"
        if key not in ("steps", "ranks", "id"):
            return f"unknown key {_quote(key)} (keys: steps, ranks, id)"
        if key in seen:
            return f"{key} is given twice"
        seen[key] = val
    steps = contract.PROFILE_DEFAULT_STEPS
    if "steps" in seen:
        text = seen["steps"]
        given = contract.profile_steps(text)
        if given is None:
            return f"steps must be an integer from 1 to {contract.PROFILE_MAX_STEPS}, not {_quote(text)}"
        steps = given
    ranks: RanksChoice = "slowest"
    if seen.get("ranks") in ("all", "slowest"):
        ranks = "all" if seen["ranks"] == "all" else "slowest"
    elif "ranks" in seen:
        parsed = _rank_list(seen["ranks"])
        if isinstance(parsed, str):
            return parsed
        ranks = parsed
    capture_id = seen.get("id", "")
    if "id" in seen and not ID_PATTERN.fullmatch(capture_id):
        return f"id must be 1 to 64 letters, digits, '.', '_' or '-', not {_quote(capture_id)}"
    return Request(value=value, steps=steps, ranks=ranks, id=capture_id)


def _quote(text: str) -> str:
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def _rank_list(text: str) -> tuple[int, ...] | str:
    items = [t.strip() for t in text.split(",")]
    if not text or any(not re.fullmatch(r"[0-9]{1,6}", t) for t in items):
        return f"ranks must be all, slowest or a comma list of ranks like 0,13, not {_quote(text)}"
    nums = [int(t) for t in items]
    if len(set(nums)) != len(nums):
        return "ranks names a rank twice"
    if len(nums) > MAX_RANKS:
        return f"ranks names {len(nums)} ranks; at most {MAX_RANKS}"
    return tuple(sorted(nums))


def format_request(steps: int, ranks: str, capture_id: str) -> str:
    """The annotation value for a request (what ``gpujob profile`` sets)."""
    return f"steps={steps};ranks={ranks};id={capture_id}"


def world_size(spec: GPUTrainingJobSpec) -> int:
    """Ranks of the whole job (nodes x procsPerNode)."""
    return spec.nodes * spec.procs_per_node


def profile_dir(spec: GPUTrainingJobSpec) -> str:
    """Where the ranks write traces: ``spec.monitoring.profile.path``, else the emptyDir."""
    return spec.monitoring.profile.path or PROFILE_DEFAULT_DIR


def slowest_ranks(status: Mapping[str, Any]) -> list[int]:
    """The ranks ``ranks=slowest`` asks: the verdict's rank and its breakdown's slowest and
    median (the comparison needs both); empty when the status names none."""
    b = status.get("bottleneck") or {}
    out = set()
    if _is_int(b.get("rank")):
        out.add(int(b["rank"]))
    for row in b.get("breakdown") or ():
        role = row.get("role") if isinstance(row, Mapping) else None
        if role in ("slowest", "median") and _is_int(row.get("rank")):
            out.add(int(row["rank"]))
    return sorted(out)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def resolve_ranks(request: Request, world: int, status: Mapping[str, Any]) -> list[int] | str:
    """The ranks to ask, or why the request cannot be met on a job of ``world`` ranks."""
    if isinstance(request.ranks, tuple):
        unknown = [r for r in request.ranks if r >= world]
        if unknown:
            return (
                f"rank{'s' if len(unknown) > 1 else ''} {','.join(map(str, unknown[:8]))} "
                f"{'do' if len(unknown) > 1 else 'does'} not exist: the job has {world} ranks "
                f"(0..{world - 1})"
            )
        return list(request.ranks)
    if request.ranks == "slowest":
        named = [r for r in slowest_ranks(status) if r < world]
        if len(named) >= 2 or world == 1:
            return named or [0]
    if world > MAX_RANKS:
        return (
            f"the job has {world} ranks; a profile asks at most {MAX_RANKS}: name them "
            "(ranks=0,13) or use slowest once a verdict names them"
        )
    return list(range(world))


def _acknowledged(value: str, profile: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    refused = profile.get("refused") or {}
    seen = (profile.get("request"), refused.get("request"), state.get("profileRequest"))
    return value[:MAX_VALUE] in seen


def waiting_request(job: Mapping[str, Any]) -> str | None:
    """The job's request annotation when the operator has not acted on it yet (None: none,
    or already accepted or refused): a second asker must not overwrite it unseen."""
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(PROFILE_ANNOTATION)
    status = job.get("status") or {}
    seen = _acknowledged(
        value or "", status.get("profile") or {}, status.get("operatorState") or {}
    )
    return None if value is None or seen else str(value)


def bookkeeping(decision: Decision) -> dict[str, Any] | None:
    """The ``status.operatorState`` fields a decision sets: the annotation value acted on,
    or the attempt the automatic capture took (None: nothing to keep)."""
    if isinstance(decision, Nothing) or (isinstance(decision, Start) and decision.resume):
        return None
    rec = decision.record
    if rec.get("auto"):
        return {"profileAutoAttempt": rec.get("attempt")}
    if rec.get("request"):
        return {"profileRequest": str(rec["request"])[:MAX_VALUE]}
    return None


def make_id(value: str, now: str, uid: str) -> str:
    """An id for a request that gave none: 8 hex digits of the value, time and job."""
    return hashlib.sha256(f"{uid}\n{now}\n{value}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Nothing:
    """No new request, and nothing under way that needs this pass."""


@dataclass(frozen=True)
class Refuse:
    """Write ``record`` as ``status.profile`` (a refused request; post a Warning Event with
    ``reason``). When ``keep`` the current record stays and ``record`` goes in its
    ``refused`` field instead: a capture is under way and is not disturbed."""

    reason: str
    record: dict[str, Any]
    keep: bool = False


@dataclass(frozen=True)
class Start:
    """Write ``record`` as ``status.profile`` (state Requested), then ask ``ranks`` for a
    capture of ``steps`` steps with id ``id`` (``GET /debug/profile?id=..&steps=..``)."""

    id: str
    steps: int
    ranks: list[int]
    record: dict[str, Any]
    resume: bool = False
    """The status says this capture is under way but this runtime does not run it (the
    operator restarted): ask again with the same id, which the ranks answer idempotently."""


Decision = Nothing | Refuse | Start


@dataclass(frozen=True)
class Job:
    """What :func:`decide` reads of a job (pieces of its body)."""

    annotations: Mapping[str, str]
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    uid: str = ""


def _job(body: Mapping[str, Any]) -> Job:
    meta = body.get("metadata") or {}
    return Job(
        annotations=meta.get("annotations") or {},
        spec=body.get("spec") or {},
        status=body.get("status") or {},
        uid=str(meta.get("uid") or ""),
    )


def _finished(status: Mapping[str, Any]) -> str | None:
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        return f"the job has finished ({phase}): its ranks are gone"
    return None


def _not_running(status: Mapping[str, Any]) -> str | None:
    phase = status.get("phase")
    if phase != "Running":
        return f"the job is not running (phase {phase or 'unknown'}): no rank to profile yet"
    return None


def base_record(
    *,
    value: str,
    capture_id: str,
    state: str,
    now: str,
    attempt: int,
    steps: int | None = None,
    ranks: Sequence[int] | None = None,
    auto: bool = False,
    path: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """A ``status.profile`` record (camelCase, None where unknown)."""
    return {
        "request": value[:MAX_VALUE],
        "id": capture_id[:64],
        "state": state,
        "reason": reason[:1024] if reason else None,
        "requestedAt": now,
        "capturedAt": None,
        "steps": steps,
        "ranks": list(ranks)[:MAX_RANKS] if ranks is not None else None,
        "auto": auto,
        "attempt": attempt,
        "path": path,
        "answer": None,
        "slowestRank": None,
        "medianRank": None,
        "operation": None,
        "configMap": None,
        "failedRanks": None,
        "refused": None,
    }


MAX_WAIT_SECONDS: Final = 3600.0
"""The longest the operator waits for a capture's ranks."""


def wait_seconds(steps: int, step_seconds: float | None = None) -> float:
    """How long the ranks of a capture are waited for: the steps at a pessimistic step time
    (three times the job's median, at least 1 s), plus a minute to reach the next boundary
    and to write and summarise the trace; at most :data:`MAX_WAIT_SECONDS`."""
    return min(MAX_WAIT_SECONDS, _wait(steps, step_seconds))


def _wait(steps: int, step_seconds: float | None) -> float:
    per_step = max(1.0, step_seconds or 10.0)
    return 60.0 + 3.0 * (steps + 1) * per_step


def step_seconds(status: Mapping[str, Any]) -> float | None:
    """The job's median step time from ``status.progress`` (None: not known yet)."""
    p50 = (status.get("progress") or {}).get("stepSecondsP50")
    if isinstance(p50, bool) or not isinstance(p50, int | float) or not p50 > 0:
        return None
    return float(p50)


def wanted(job: Mapping[str, Any]) -> bool:
    """Whether :func:`decide` could do anything for ``job`` (read from the raw body, no
    parsing: every job's metrics task asks it on every wake-up)."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    profile = status.get("profile") or {}
    if profile.get("state") in IN_FLIGHT:
        return True
    value = (meta.get("annotations") or {}).get(PROFILE_ANNOTATION)
    if value is not None and not _acknowledged(value, profile, status.get("operatorState") or {}):
        return True
    monitoring = (job.get("spec") or {}).get("monitoring") or {}
    return (
        monitoring.get("profileOnVerdict") is True
        and (status.get("bottleneck") or {}).get("severity") == "Warning"
        and (status.get("operatorState") or {}).get("profileAutoAttempt") != attempt_of(status)
    )


def failed_record(profile: Mapping[str, Any], why: str, now: str) -> dict[str, Any]:
    """A capture under way, ended as Failed with why (the job ended, the gang restarted,
    its ranks could not be asked)."""
    return {**profile, "state": "Failed", "reason": why, "capturedAt": now}


def decide(job: Mapping[str, Any], now: str, in_flight: str | None = None) -> Decision:
    """What to do with ``job`` (its body: metadata.annotations, spec, status) this pass.

    ``now``: the time to record (RFC 3339); ``in_flight``: the id of the capture this
    runtime is running for the job, None when it runs none. A manual request wins over the
    automatic one (:func:`auto_request`) in the same pass.
    """
    if in_flight is None and not wanted(job):
        return Nothing()
    j = _job(job)
    status, profile = j.status, (j.status.get("profile") or {})
    attempt = attempt_of(status)
    value = j.annotations.get(PROFILE_ANNOTATION)
    under_way = profile.get("state") in IN_FLIGHT
    if value is not None and not _acknowledged(value, profile, status.get("operatorState") or {}):
        return _manual(j, value, now, attempt, in_flight, under_way)
    if under_way and in_flight is None and profile.get("id"):
        why = _finished(status)
        if why is not None:
            return Refuse(why, failed_record(profile, why, now))
        return Start(
            id=str(profile["id"]),
            steps=int(profile.get("steps") or contract.PROFILE_DEFAULT_STEPS),
            ranks=[int(r) for r in profile.get("ranks") or () if _is_int(r)],
            record=dict(profile),
            resume=True,
        )
    if in_flight is None and not under_way:
        auto = auto_request(job, now)
        if auto is not None:
            return auto
    return Nothing()


def _manual(
    j: Job, value: str, now: str, attempt: int, in_flight: str | None, under_way: bool
) -> Refuse | Start:
    parsed = parse_request(value)
    capture_id = (
        parsed.id if isinstance(parsed, Request) and parsed.id else make_id(value, now, j.uid)
    )

    def refuse(why: str, keep: bool = False) -> Refuse:
        rec = base_record(
            value=value,
            capture_id=capture_id,
            state="Refused",
            now=now,
            attempt=attempt,
            reason=why,
        )
        return Refuse(why, rec, keep)

    if isinstance(parsed, str):
        return refuse(parsed)
    why = _finished(j.status)
    if why is not None:
        return refuse(why)
    current = in_flight or (str(j.status.get("profile", {}).get("id")) if under_way else None)
    if current is not None:
        return refuse(
            f"a capture (id {current}) is under way: one at a time; ask again when it is done",
            keep=True,
        )
    try:
        spec = parse_spec(j.spec)
    except ValidationError:
        return refuse("the job's spec does not pass the API's checks")
    if not spec.monitoring.enabled:
        return refuse("spec.monitoring.enabled is false: the operator does not talk to the ranks")
    why = _not_running(j.status)
    if why is not None:
        return refuse(why)
    ranks = resolve_ranks(parsed, world_size(spec), j.status)
    if isinstance(ranks, str):
        return refuse(ranks)
    per_step = step_seconds(j.status)
    if _wait(parsed.steps, per_step) > MAX_WAIT_SECONDS:
        return refuse(
            f"at {per_step:.3g}s per step, {parsed.steps} steps could outlast the operator's "
            f"wait of {MAX_WAIT_SECONDS / 60:.0f} min: ask fewer steps"
        )
    rec = base_record(
        value=value,
        capture_id=capture_id,
        state="Requested",
        now=now,
        attempt=attempt,
        steps=parsed.steps,
        ranks=ranks,
        path=profile_dir(spec),
    )
    return Start(id=capture_id, steps=parsed.steps, ranks=ranks, record=rec)


def auto_request(job: Mapping[str, Any], now: str) -> Start | None:
    """``spec.monitoring.profileOnVerdict``: a capture of the default steps on the slowest
    ranks, once per attempt, while a Warning verdict is published (it held for its
    hysteresis); None when not due."""
    j = _job(job)
    try:
        spec = parse_spec(j.spec)
    except ValidationError:
        return None
    if not spec.monitoring.enabled or not spec.monitoring.profile_on_verdict:
        return None
    status = j.status
    if (
        status.get("phase") != "Running"
        or (status.get("bottleneck") or {}).get("severity") != "Warning"
    ):
        return None
    attempt = attempt_of(status)
    profile = status.get("profile") or {}
    if profile.get("state") in IN_FLIGHT:
        return None
    if profile.get("auto") and profile.get("attempt") == attempt:
        return None
    if (status.get("operatorState") or {}).get("profileAutoAttempt") == attempt:
        return None  # once per attempt, whatever manual captures came since
    req = Request(value="", steps=contract.PROFILE_DEFAULT_STEPS, ranks="slowest")
    ranks = resolve_ranks(req, world_size(spec), status)
    if isinstance(ranks, str):
        return None
    capture_id = f"auto-{attempt}-{make_id('auto', now, j.uid)}"
    rec = base_record(
        value="",
        capture_id=capture_id,
        state="Requested",
        now=now,
        attempt=attempt,
        steps=req.steps,
        ranks=ranks,
        auto=True,
        path=profile_dir(spec),
    )
    return Start(id=capture_id, steps=req.steps, ranks=ranks, record=rec)


def apply(status_profile: Mapping[str, Any] | None, decision: Decision) -> dict[str, Any] | None:
    """The ``status.profile`` to write for ``decision`` (None: leave it as it is)."""
    if isinstance(decision, Nothing):
        return None
    if isinstance(decision, Refuse) and decision.keep:
        rec = decision.record
        return {
            **dict(status_profile or {}),
            "refused": {
                "request": rec["request"],
                "id": rec["id"],
                "reason": rec["reason"],
                "at": rec["requestedAt"],
            },
        }
    return dict(decision.record)


PROFILE_ADVICE: Final = " A profile of this attempt: "
"""What joins a verdict's advice once the attempt has a captured profile (once)."""


def with_profile(
    bottleneck: Mapping[str, Any] | None, profile: Mapping[str, Any] | None, attempt: int
) -> dict[str, Any] | None:
    """The verdict with its advice pointing at this attempt's captured profile (the answer
    and its ConfigMap); the verdict unchanged when there is none or it already points."""
    if not bottleneck:
        return None
    out = dict(bottleneck)
    p = profile or {}
    if p.get("state") != "Captured" or p.get("attempt") != attempt or not p.get("configMap"):
        return out
    advice = str(out.get("advice") or "")
    if PROFILE_ADVICE in advice:
        advice = advice[: advice.index(PROFILE_ADVICE)]
    tail = (
        f"{PROFILE_ADVICE}{p.get('answer') or ''} (kubectl get configmap {p['configMap']} -o yaml)"
    )
    out["advice"] = (advice + tail)[:2048]
    return out
