"""Profile captures on request: ``torch.profiler`` over the next N training steps of a rank.

The exporter's thread asks (:meth:`Profiler.request`, from ``GET /debug/profile?id=&steps=``);
the training thread does the capture at its step boundaries; a daemon thread exports the
trace and summarises it (`profilesummary`). The states a capture goes through:

    pending -> capturing -> summarizing -> done
       \\-----------\\-------------\\------> failed (with why)

* **pending**: asked; the capture starts at the rank's next step boundary.
* **capturing**: ``torch.profiler.profile`` runs (CPU activities, plus CUDA where the model
  is on a GPU; shapes, stacks and memory off). Each step boundary calls ``prof.step()``, so
  ``ProfilerStep#k`` annotations mark the steps; after N steps it stops.
* **summarizing**: a daemon thread writes the chrome trace to
  ``$GPUJOB_PROFILE_DIR/<job>-rank<R>-<id>.pt.trace.json`` and summarises it.
* **done** / **failed**: the summary, or why there is none (the profiler refused to start,
  the export or the summary failed, training ended mid-capture). Training never stops for
  a capture.

Outside a capture the cost is one attribute read per step boundary (``Tracker._profiling``,
false): the hooks call :meth:`Profiler.tick` only while it is true, and ``torch.profiler`` is
imported only when a capture starts.

Step boundaries: the end of an optimizer step (the optimizer hooks) and ``end_step()``. An
iteration with both counts once (an ``end_step()`` after an optimizer step ends nothing more),
and with several optimizers per iteration (a GAN) only the first one seen in the capture
draws the boundaries.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from gpujob_trainer import contract, profilesummary

log = logging.getLogger("gpujob_trainer")

VERSION: Final = 1
ID_PATTERN: Final = contract.PROFILE_ID
MAX_ERROR: Final = 300
"""Characters kept of a failure's reason."""
MAX_SUMMARY_BYTES: Final = 16 * 1024
MAX_TRACE_BYTES: Final = 64 * 2**20
"""The largest trace the rank reads back to summarise: a parsed trace takes about ten times
its size in Python objects, on the rank's host, beside the training."""
ENV_JOB_NAME: Final = "GPUJOB_JOB_NAME"
"""The job's name, set in the pod by the operator (its `api.ENV_JOB_NAME`); unset: "local"."""
DEFAULT_DIR_NAME: Final = "gpujob-profiles"

IDLE, PENDING, CAPTURING, SUMMARIZING, DONE, FAILED, BUSY, UNAVAILABLE = (
    "idle",
    "pending",
    "capturing",
    "summarizing",
    "done",
    "failed",
    "busy",
    "unavailable",
)
IN_FLIGHT: Final = frozenset((PENDING, CAPTURING, SUMMARIZING))


class RequestError(ValueError):
    """A request the endpoint refuses (HTTP 400), with why."""


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether captures are offered (``GPUJOB_PROFILE``, on unless 0/false/off/no)."""
    env = os.environ if env is None else env
    value = env.get(contract.ENV_PROFILE, "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def why_unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why this process offers no captures (None: it does): turned off, or no torch."""
    if not enabled(env):
        return f"profiling is off ({contract.ENV_PROFILE}=0)"
    if importlib.util.find_spec("torch") is None:  # looked up, not imported
        return "torch is not installed in this process"
    return None


def parse_request(query: dict[str, list[str]]) -> tuple[str, int] | None:
    """(id, steps) of a query (``parse_qs`` form), None without an ``id`` (a state read);
    raises :class:`RequestError` for a bad id or step count."""
    ids = query.get("id")
    raw_steps = query.get("steps")
    if not ids:
        if raw_steps:
            raise RequestError("steps without an id: give id=<[A-Za-z0-9._-]{1,64}>")
        return None
    ident = ids[-1]
    if not ID_PATTERN.fullmatch(ident):
        raise RequestError(f"id must match [A-Za-z0-9._-]{{1,64}}, got {ident[:80]!r}")
    if not raw_steps:
        return ident, contract.PROFILE_DEFAULT_STEPS
    text = raw_steps[-1].strip()
    steps = contract.profile_steps(text)
    if steps is None:
        raise RequestError(
            f"steps must be an integer from 1 to {contract.PROFILE_MAX_STEPS}, got {text[:20]!r}"
        )
    return ident, steps


def profile_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where traces go: ``$GPUJOB_PROFILE_DIR``, else ``<tempdir>/gpujob-profiles``."""
    env = os.environ if env is None else env
    given = env.get(contract.ENV_PROFILE_DIR, "").strip()
    return Path(given) if given else Path(tempfile.gettempdir()) / DEFAULT_DIR_NAME


def trace_name(job: str | None, rank: int, ident: str) -> str:
    """``<job-or-"local">-rank<R>-<ID>.pt.trace.json`` (the job name made file-safe)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job or "")[:128] or "local"
    return f"{safe}-rank{rank}-{ident}.pt.trace.json"


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR]


class Capture(Protocol):
    """What a capture needs of ``torch.profiler.profile`` (tests give a fake)."""

    def start(self) -> None: ...

    def step(self) -> None: ...

    def stop(self) -> None: ...

    def export_chrome_trace(self, path: str) -> Any: ...


def torch_capture(cuda: bool) -> Capture:
    """A ``torch.profiler.profile`` that records every step (imported here, only now)."""
    from torch import profiler as tp

    activities = [tp.ProfilerActivity.CPU]
    if cuda:
        activities.append(tp.ProfilerActivity.CUDA)
    prof: Capture = tp.profile(
        activities=activities,
        # A schedule makes the profiler mark each step (ProfilerStep#k); this one records
        # them all, and stop() ends the capture (without a trace handler: we export).
        schedule=lambda step: tp.ProfilerAction.RECORD,
        record_shapes=False,
        with_stack=False,
        profile_memory=False,
    )
    return prof


PENDING_SECONDS: Final = 3600.0
"""How long a requested capture waits for its first step (the operator's longest wait)."""


class Profiler:
    """One rank's captures: requested over HTTP, run by the training thread.

    `arm(on)` sets the one flag the training thread reads at each step boundary (the
    tracker's ``_profiling``); while it is set the boundaries call :meth:`tick`.
    """

    def __init__(
        self,
        *,
        rank: int,
        arm: Callable[[bool], None],
        cuda: Callable[[], bool] = lambda: False,
        make: Callable[[bool], Capture] = torch_capture,
        directory: Callable[[], Path] = profile_dir,
        job: str | None = None,
        wall: Callable[[], float] = time.time,
        background: Callable[[Callable[[], None]], None] | None = None,
        available: str | None = None,
        summarize: Callable[[str, int, int], dict[str, Any]] | None = None,
    ) -> None:
        self.rank = rank
        self._arm = arm
        self._cuda = cuda
        self._make = make
        self._directory = directory
        self._job = job if job is not None else (os.environ.get(ENV_JOB_NAME) or None)
        self._wall = wall
        self._background = background or _daemon
        self._summarize = summarize or summarize_apart
        self.unavailable = available
        """Why captures are not offered (None: they are)."""
        self._lock = threading.Lock()
        self._state = IDLE
        self._id: str | None = None
        self._steps = 0
        self._done = 0
        self._requested_at: float | None = None
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._trace: str | None = None
        self._trace_bytes: int | None = None
        self._error: str | None = None
        self._summary: dict[str, Any] | None = None
        self._capture: Capture | None = None
        self._lead: Any = None
        """The optimizer whose steps draw the boundaries in this capture."""
        self._saw_optimizer = False
        """An optimizer step drew a boundary since the last `end_step()`."""
        self._closed = False
        self.latest_parts: dict[str, float] | None = None
        """The last finished summary's parts (what the gauge shows)."""

    # ------------------------------------------------------------------ the HTTP side
    def state(self) -> dict[str, Any]:
        """The state document (version 1); "unavailable" with why where captures are off."""
        with self._lock:
            if self.unavailable is not None:
                return {**self._document(UNAVAILABLE), "error": self.unavailable}
            return self._document()

    def _document(self, state: str | None = None) -> dict[str, Any]:
        return {
            "version": VERSION,
            "rank": self.rank,
            "id": self._id,
            "state": state or self._state,
            "steps": self._steps,
            "stepsDone": self._done,
            "requestedAt": self._requested_at,
            "startedAt": self._started_at,
            "finishedAt": self._finished_at,
            "trace": self._trace,
            "traceBytes": self._trace_bytes,
            "error": self._error,
            "summary": self._summary,
        }

    def _expire_locked(self) -> None:
        """A capture still waiting for its first step after :data:`PENDING_SECONDS` (the
        loop stopped stepping; the operator gave up long ago) fails, so it no longer makes
        every later request busy."""
        since = self._requested_at
        if self._state == PENDING and since is not None and self._wall() - since > PENDING_SECONDS:
            self._fail_locked(f"no training step came within {PENDING_SECONDS:.0f}s of the request")

    def request(self, ident: str, steps: int) -> dict[str, Any]:
        """Ensure a capture `ident` of `steps` steps: start it unless it is the current or
        last one (then its state), or another is in flight (then "busy")."""
        if self.unavailable is not None:
            return self.state()
        with self._lock:
            self._expire_locked()
            if ident == self._id:
                return self._document()
            if self._state in IN_FLIGHT:
                return {**self._document(BUSY), "busyWith": self._id}
            self._id, self._steps, self._done = ident, steps, 0
            self._requested_at = self._wall()
            self._started_at = self._finished_at = None
            self._trace = self._trace_bytes = self._error = None
            self._summary = None
            self._lead, self._saw_optimizer = None, False
            if self._closed:
                self._fail_locked("training is over on this rank: no step left to profile")
            else:
                self._state = PENDING
                self._arm(True)
            return self._document()

    # ------------------------------------------------------------------ the training side
    def tick(self, optimizer: Any = None) -> None:
        """A step boundary: an optimizer step's end (`optimizer`: its key) or `end_step()`
        (None). Runs on the training thread, only while armed."""
        if optimizer is None:
            if self._saw_optimizer:  # this iteration's optimizer step drew it already
                self._saw_optimizer = False
                return
        else:
            self._saw_optimizer = True
            if self._lead is None:
                self._lead = optimizer
            elif optimizer != self._lead:
                return  # another optimizer of the same iteration
        # Decide under the lock, call the profiler outside it: its start and stop can take
        # seconds (stop gathers every event), and the HTTP thread answering the operator's
        # polls must not wait for them.
        cuda, capture = False, None
        with self._lock:
            if self._state == PENDING:
                cuda = bool(self._cuda())
            elif self._state == CAPTURING and self._capture is not None:
                capture = self._capture
                self._done += 1
            else:
                self._arm(False)
                return
            ident, done, steps = self._id, self._done, self._steps
        if capture is None:
            self._start(ident, cuda)
        elif done < steps:
            try:
                capture.step()
            except Exception as exc:
                self._failed_at(ident, capture, f"the profiler failed at step {done}: {_why(exc)}")
        else:
            self._stop(ident, capture, done)

    def _start(self, ident: str | None, cuda: bool) -> None:
        try:
            capture = self._make(cuda)
            capture.start()
        except Exception as exc:  # another profiler running, no kineto ...: no capture
            with self._lock:
                if self._id == ident and self._state == PENDING:
                    self._fail_locked(f"the profiler did not start: {_why(exc)}")
            return
        with self._lock:
            if self._id == ident and self._state == PENDING:
                self._capture = capture
                self._state = CAPTURING
                self._started_at = self._wall()
                return
        _stop_quietly(capture)  # closed meanwhile: nothing to keep

    def _stop(self, ident: str | None, capture: Capture, done: int) -> None:
        try:
            capture.stop()
        except Exception as exc:
            self._failed_at(ident, capture, f"the profiler failed at step {done}: {_why(exc)}")
            return
        with self._lock:
            if self._id != ident or self._state != CAPTURING:
                return  # closed meanwhile (it said why)
            self._capture = None
            self._state = SUMMARIZING
            self._arm(False)
        assert ident is not None
        box = [capture]  # the background takes it out, so the profiler's buffers can go
        self._background(lambda: self._finish(box, ident))

    def _failed_at(self, ident: str | None, capture: Capture, why: str) -> None:
        with self._lock:
            if self._id == ident and self._state == CAPTURING:
                self._capture = None
                self._fail_locked(why)
        _stop_quietly(capture)

    def _fail_locked(self, why: str) -> None:
        self._state = FAILED
        self._error = why[:MAX_ERROR]
        self._finished_at = self._wall()
        self._arm(False)
        log.warning("gpujob: profile %s on rank %d failed: %s", self._id, self.rank, self._error)

    def close(self) -> None:
        """Training is over (`Tracker.close`): a capture not yet captured fails."""
        with self._lock:
            self._closed = True
            if self._state not in (PENDING, CAPTURING):
                return
            capture, self._capture = self._capture, None
            where = (
                f"after {self._done} of {self._steps} steps"
                if self._state == CAPTURING
                else "before the capture started"
            )
            self._fail_locked(f"training ended {where}")
        if capture is not None:
            _stop_quietly(capture)

    # ------------------------------------------------------------------ the background side
    def _finish(self, box: list[Capture], ident: str) -> None:
        """Export the trace and summarise it (a daemon thread)."""
        capture = box.pop()
        try:
            directory = self._directory()
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / trace_name(self._job, self.rank, ident)
            partial = path.with_name(path.name + ".partial")
            capture.export_chrome_trace(str(partial))
            os.replace(partial, path)
            size = path.stat().st_size
            _prune(directory, self.rank, keep=path)
        except Exception as exc:
            self._finished(ident, error=f"the trace export failed: {_why(exc)}")
            return
        del capture  # the profiler's buffers go now, before the trace is read
        with self._lock:
            if self._id == ident:
                self._trace, self._trace_bytes = str(path.resolve()), size
        if size > MAX_TRACE_BYTES:
            self._finished(
                ident,
                error=f"the trace is {size} bytes, over the {MAX_TRACE_BYTES} the rank reads "
                "to summarise it (the trace file is kept)",
            )
            return
        try:
            summary = _bounded(self._summarize(str(path), self.rank, self._steps))
        except Exception as exc:
            self._finished(ident, error=f"the summary failed: {_why(exc)}")
            return
        self._finished(ident, summary=summary)

    def _finished(
        self, ident: str, *, summary: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        with self._lock:
            if self._id != ident:  # cannot happen while in flight; never overwrite another
                return
            if error is not None:
                self._fail_locked(error)
                return
            self._summary = summary
            self._state = DONE
            self._finished_at = self._wall()
            if summary is not None:
                self.latest_parts = dict(summary["parts"])


KEEP_TRACES: Final = 3
"""Traces of one rank kept in the folder (the newest): captures never fill the pod's disk."""


def _prune(directory: Path, rank: int, keep: Path) -> None:
    """Delete this rank's older traces (and any half-written one) beyond the newest
    :data:`KEEP_TRACES`; a file that cannot be deleted is left (telemetry never fails)."""
    mine = [p for p in directory.glob(f"*-rank{rank}-*.pt.trace.json*") if p != keep]
    done = sorted((p for p in mine if not p.name.endswith(".partial")), key=_mtime)
    doomed = done[: max(0, len(done) - (KEEP_TRACES - 1))]
    doomed += [p for p in mine if p.name.endswith(".partial")]
    for path in doomed:
        try:
            path.unlink()
        except OSError as exc:
            log.debug("gpujob: an old profile trace stays: %s", exc)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


SUMMARY_SECONDS: Final = 600.0
"""The longest a trace's summary may take (its child process is killed then)."""


def summarize_apart(path: str, rank: int, steps: int) -> dict[str, Any]:
    """The trace's summary, computed by a child Python process: parsing a trace of tens of
    megabytes takes a second of CPU and ten times its size in memory, which the training
    process must not pay in held GIL or kept heap. Its answer is bounded like any input."""
    package = str(Path(profilesummary.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package, os.environ.get("PYTHONPATH", "")) if p
    )}  # fmt: skip
    done = subprocess.run(
        # the package imports this module before runpy runs it: a harmless warning, hushed
        [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "gpujob_trainer.profilesummary",
            path,
            str(rank),
            str(steps),
        ],
        capture_output=True,
        env=env,
        timeout=SUMMARY_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = lines[-1][:MAX_ERROR] if lines else ""
        raise profilesummary.SummaryError(why or f"exit code {done.returncode}")
    if len(done.stdout) > 4 * MAX_SUMMARY_BYTES:
        raise profilesummary.SummaryError(f"the summary is {len(done.stdout)} bytes")
    summary = json.loads(done.stdout)
    if not isinstance(summary, dict):
        raise profilesummary.SummaryError("the summary is not a JSON object")
    return summary


def _bounded(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary within MAX_SUMMARY_BYTES (operation names cut shorter if need be)."""
    for cut in (profilesummary.MAX_NAME, 80, 40):
        for op in summary["top"]:
            op["name"] = op["name"][:cut]
        if len(json.dumps(summary)) <= MAX_SUMMARY_BYTES:
            return summary
    raise ValueError(f"the summary exceeds {MAX_SUMMARY_BYTES} bytes")


def _stop_quietly(capture: Capture) -> None:
    try:
        capture.stop()
    except Exception as exc:  # already stopped, or broken: nothing more to do
        log.debug("gpujob: stopping a failed profile capture: %s", exc)


def _daemon(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="gpujob-profile", daemon=True).start()
