"""The in-place restart supervisor: a barrier before each run and a stop for a stale one.

With ``runPolicy.restartStrategy: InPlace`` the operator starts the trainer's command as
``python -m gpujob_trainer.supervisor --podinfo=DIR --state=DIR -- COMMAND...``. When the
container exits with :data:`~gpujob_trainer.contract.RESTART_EXIT_CODE`, its restart rule
(``RestartAllContainers``) makes the kubelet restart every container of the pod in place:
the pod keeps its name, IP and volumes, so no scheduling and no image pull stand between two
attempts. Two things then need the operator's word, and the pod's labels and annotations
(a downward API volume, ``--podinfo``) carry it:

* **The barrier.** A rank restarted in place must not meet a rank still running the old
  attempt (a rendezvous across attempts hangs or, worse, trains on mixed state). So a
  supervisor that has started before (its count lives in an emptyDir, ``--state``, that
  survives the restart) waits, without a timeout of its own, until the pod's
  :data:`~gpujob_trainer.contract.LABEL_ATTEMPT` label is past the attempt it last ran and
  its :data:`~gpujob_trainer.contract.ANNOTATION_RELEASED` annotation names that label: the
  operator sets the annotation once every pod of the gang has restarted for the attempt,
  and deletes a pod that never converges.
* **The stop.** When the operator moves a running pod's attempt label forward, this run is
  stale: the supervisor stops COMMAND's process group (SIGTERM, then SIGKILL after
  ``--grace`` seconds) and exits with the restart code, so the pod restarts in place. The
  operator also says which restart count the new run begins at
  (:data:`~gpujob_trainer.contract.ANNOTATION_RESTARTS_BASE`); a supervisor that has started
  fewer times than that (waiting at the barrier, or never started before) exits with the
  restart code at once. The code is the supervisor's alone: a COMMAND exiting 87 is
  reported as 1.
* **A pod created during an in-place restart** (annotation
  :data:`~gpujob_trainer.contract.ANNOTATION_HOLD`) waits for the release on its first
  start too.

Otherwise it is transparent: COMMAND runs in its own process group with
:data:`~gpujob_trainer.contract.ENV_ATTEMPT` set, SIGTERM and SIGINT reach that group, and the
supervisor exits with COMMAND's code (``128 + N`` for a signal N). It uses the standard
library only: it runs before, and around, whatever the trainer image installs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpujob_trainer import contract

MARK = "gpujob supervisor"
STATE_FILE = "supervisor.json"
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def say(line: str) -> None:
    """One line to stderr, where the pod's log shows it."""
    print(f"{MARK}: {line}", file=sys.stderr, flush=True)


# --- pure helpers


def parse_downward(text: str) -> dict[str, str]:
    """A downward API ``labels``/``annotations`` file (``key="value"`` lines, the value a
    quoted string) as a dict; malformed lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or not key.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, str):
            out[key.strip()] = value
    return out


def read_downward(folder: Path, name: str) -> dict[str, str]:
    """One file of the downward API volume, parsed; missing or unreadable: empty."""
    try:
        return parse_downward((folder / name).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}


def read_attempt(labels: Mapping[str, str]) -> int:
    """The pod's gang attempt from its labels; missing or not a number: 0."""
    try:
        return int(labels.get(contract.LABEL_ATTEMPT, "0"))
    except ValueError:
        return 0


def released(attempt: int, annotations: Mapping[str, str], last: int | None) -> bool:
    """Whether a supervisor restarted after running ``last`` may run ``attempt`` (the label)."""
    later = last is None or attempt > last
    return later and annotations.get(contract.ANNOTATION_RELEASED) == str(attempt)


def restart_wanted(annotations: Mapping[str, str], starts: int) -> bool:
    """Whether the operator expects this pod to restart (once more) before its next run: the
    restart count its new run begins at is above this start's (the starts before it)."""
    try:
        base = int(annotations.get(contract.ANNOTATION_RESTARTS_BASE, "0"))
    except ValueError:
        return False
    return base > starts


def held(annotations: Mapping[str, str]) -> bool:
    """A pod created during an in-place restart: its first run waits for the release too."""
    return annotations.get(contract.ANNOTATION_HOLD) == "true"


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class State:
    """What survives an in-place restart: how often COMMAND started, and for which attempt."""

    starts: int = 0
    attempt: int | None = None

    @classmethod
    def load(cls, path: Path) -> State:
        """The saved state; missing or unreadable: a first start."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            starts = data["starts"]
            attempt = data.get("attempt")
            if not isinstance(starts, int) or not (attempt is None or isinstance(attempt, int)):
                return cls()
            return cls(starts, attempt)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return cls()

    def save(self, path: Path) -> None:
        """Write atomically (a temporary file, then a rename): a restart reads all or none."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"starts": self.starts, "attempt": self.attempt}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# --- processes and signals


@dataclass(frozen=True)
class Options:
    """The command line: where the pod's info and the state live, the periods, COMMAND."""

    podinfo: Path
    state: Path
    grace: float
    poll: float
    command: list[str]


class Signalled(Exception):
    """SIGTERM or SIGINT before COMMAND started: the supervisor exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Signalled(signum)


class Forwarder:
    """Sends SIGTERM and SIGINT on to COMMAND's process group (kept until it starts)."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.pending: list[int] = []

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.pgid is None:
            self.pending.append(signum)
        else:
            kill_group(self.pgid, signum)

    def started(self, pgid: int) -> None:
        """COMMAND runs as group ``pgid``: forward what came while it was starting."""
        self.pgid = pgid
        for signum in self.pending:
            kill_group(pgid, signum)


def kill_group(pgid: int, signum: int) -> None:
    """Signal a process group; one already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


class RestartWanted(Exception):
    """The operator moved the pod and expects it to restart in place (exit 87)."""


def wait_release(podinfo: Path, last: int | None, starts: int, poll: float) -> int:
    """Block until the operator releases a later attempt; return it. Raises RestartWanted
    when the operator wants a restart first."""
    while True:
        attempt = read_attempt(read_downward(podinfo, "labels"))
        annotations = read_downward(podinfo, "annotations")
        if restart_wanted(annotations, starts):
            raise RestartWanted
        if released(attempt, annotations, last):
            return attempt
        time.sleep(poll)


def supervise(child: subprocess.Popen[bytes], podinfo: Path, attempt: int, a: Options) -> int:
    """Wait for COMMAND; stop it if the pod moves past ``attempt``. The exit code."""
    while True:
        try:
            code = exit_code(child.wait(timeout=a.poll))
            if code == contract.RESTART_EXIT_CODE:
                # 87 is the supervisor's own word for "restart me": never a rank's failure.
                say(f"the command exited {code}, which is reserved: exiting 1 instead")
                return 1
            return code
        except subprocess.TimeoutExpired:
            pass
        now = read_attempt(read_downward(podinfo, "labels"))
        if now > attempt:
            break
    say(
        f"the pod moved to attempt {now}: stopping attempt {attempt} (SIGTERM, SIGKILL after "
        f"{a.grace:g}s) and exiting {contract.RESTART_EXIT_CODE} to restart in place"
    )
    kill_group(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=a.grace)
    kill_group(child.pid, signal.SIGKILL)
    child.wait()
    return contract.RESTART_EXIT_CODE


# --- command line


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text}")
    return value


def parse(argv: Sequence[str]) -> Options:
    """The options before ``--`` and COMMAND after it; a usage error exits 2."""
    p = argparse.ArgumentParser(
        prog=f"python -m {contract.SUPERVISOR_MODULE}",
        usage="%(prog)s [--podinfo DIR] [--state DIR] [--grace S] [--poll S] -- COMMAND...",
    )
    p.add_argument("--podinfo", type=Path, default=Path(contract.PODINFO_DIR))
    p.add_argument("--state", type=Path, default=Path(contract.INPLACE_STATE_DIR))
    p.add_argument("--grace", type=_positive, default=5.0, help="SIGTERM to SIGKILL, seconds")
    p.add_argument("--poll", type=_positive, default=0.2, help="podinfo poll period, seconds")
    args = list(argv)
    if "--" not in args:
        p.error("a command to supervise is required after --")
    cut = args.index("--")
    a = p.parse_args(args[:cut])
    command = args[cut + 1 :]
    if not command:
        p.error("the command after -- is empty")
    return Options(a.podinfo, a.state, a.grace, a.poll, command)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    state_path = a.state / STATE_FILE
    state = State.load(state_path)
    try:
        for s in FORWARDED:
            signal.signal(s, _raise)
        annotations = read_downward(a.podinfo, "annotations")
        if state.starts > 0 or held(annotations):
            say(
                f"restarted in place after attempt {state.attempt}: waiting for the operator "
                "to release the next attempt"
                if state.starts
                else "created during an in-place restart: waiting for the operator to "
                "release the attempt"
            )
            attempt = wait_release(a.podinfo, state.attempt, state.starts, a.poll)
        elif restart_wanted(annotations, state.starts):
            raise RestartWanted
        else:
            attempt = read_attempt(read_downward(a.podinfo, "labels"))
        State(state.starts + 1, attempt).save(state_path)
        forward = Forwarder()
        for s in FORWARDED:
            signal.signal(s, forward)
    except Signalled as e:
        return 128 + e.signum
    except RestartWanted:
        # Counted as a start: the restart that follows is the one the operator waits for.
        State(state.starts + 1, state.attempt).save(state_path)
        say(f"the operator restarts this pod in place: exiting {contract.RESTART_EXIT_CODE}")
        return contract.RESTART_EXIT_CODE
    say(f"released: running attempt {attempt}" if state.starts else f"running attempt {attempt}")
    env = {**os.environ, contract.ENV_ATTEMPT: str(attempt)}
    try:
        child = subprocess.Popen(a.command, env=env, start_new_session=True)
    except OSError as e:
        say(f"cannot run {a.command[0]}: {e}")
        return 126 if isinstance(e, PermissionError) else 127
    forward.started(child.pid)
    try:
        return supervise(child, a.podinfo, attempt, a)
    finally:
        kill_group(child.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
