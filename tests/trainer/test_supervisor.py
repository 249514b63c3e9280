"""The in-place restart supervisor as a pod runs it: a real ``python -m`` process reading a
downward-API-shaped folder that the test rewrites the way the kubelet does (a new file, then a
rename), around real child processes. Every wait is on a condition with a deadline; the only
fixed windows are the two that check the barrier holds (nothing to wait for there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.waiting import wait_until

from gpujob_trainer import contract
from gpujob_trainer.supervisor import STATE_FILE, State, parse_downward, read_attempt, released

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 30.0

# The child: record its pid, attempt and (optionally) a grandchild's pid, then run on.
CHILD = """
import json, os, signal, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grand = None
if mode in ("grandchild", "leave-grandchild"):
    grand = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]).pid
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "attempt": os.environ.get("GPUJOB_ATTEMPT"),
               "grandchild": grand}, f)
os.replace(out + ".tmp", out)
if mode == "leave-grandchild":
    sys.exit(5)
time.sleep(120)
"""


def write_downward(folder: Path, name: str, values: dict[str, str]) -> None:
    """As the kubelet does: the whole file anew, swapped in by a rename."""
    text = "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(values.items()))
    tmp = folder / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / name)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for a parent that is not us, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


class Pod:
    """One container's supervisor: its podinfo and state folders, its log and the child's
    marker file."""

    def __init__(self, root: Path) -> None:
        self.podinfo = root / "podinfo"
        self.state = root / "state"
        self.podinfo.mkdir()
        self.state.mkdir()
        self.log = root / "supervisor.log"
        self.marker = root / "marker.json"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []

    def labels(self, attempt: int) -> None:
        write_downward(self.podinfo, "labels", {contract.LABEL_ATTEMPT: str(attempt), "app": "x"})

    def release(self, attempt: int) -> None:
        write_downward(self.podinfo, "annotations", {contract.ANNOTATION_RELEASED: str(attempt)})

    def start(self, *command: str, grace: float = 30.0) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'trainer_image'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        args = [sys.executable, "-m", contract.SUPERVISOR_MODULE, f"--podinfo={self.podinfo}",
                f"--state={self.state}", f"--grace={grace:g}", "--poll=0.05", "--", *command]  # fmt: skip
        with self.log.open("ab") as log:
            p = subprocess.Popen(args, env=env, stdout=log, stderr=log)
        self.procs.append(p)
        return p

    def child(self, mode: str = "run") -> subprocess.Popen[bytes]:
        return self.start(sys.executable, "-c", CHILD, str(self.marker), mode)

    def ran(self) -> dict[str, object]:
        """The child's record, once it wrote it."""

        def record() -> dict[str, object] | None:
            return json.loads(self.marker.read_text()) if self.marker.exists() else None

        got = wait_until(record, DEADLINE, "the child to start", 0.02)
        self.pids += [int(str(v)) for k, v in got.items() if k != "attempt" and v is not None]
        return got

    def said(self, text: str) -> None:
        wait_until(
            lambda: text in self.log.read_text(), DEADLINE, f"the supervisor to say {text!r}", 0.02
        )


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path)
    yield p
    for proc in p.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in p.pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def finish(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=DEADLINE)


def test_parse_downward_reads_kubelet_lines_and_skips_junk() -> None:
    text = (
        'app="trainer"\n'
        'gpujob.dev/attempt="3"\n'
        'kubectl.kubernetes.io/last-applied-configuration="{\\"a\\":\\"b=c\\"}\\n"\n'
        'note="tab\\there \\u00e9 \\"quoted\\""\n'
        'empty=""\n'
        "junk line without equals\n"
        "unquoted=3\n"
        'broken="no end\n'
        '="no key"\n'
        "\n"
    )
    assert parse_downward(text) == {
        "app": "trainer",
        "gpujob.dev/attempt": "3",
        "kubectl.kubernetes.io/last-applied-configuration": '{"a":"b=c"}\n',
        "note": 'tab\there é "quoted"',
        "empty": "",
    }
    assert read_attempt({contract.LABEL_ATTEMPT: "7"}) == 7
    assert read_attempt({contract.LABEL_ATTEMPT: "seven"}) == 0
    assert read_attempt({}) == 0


def test_released_needs_a_later_attempt_named_by_the_annotation() -> None:
    ann = {contract.ANNOTATION_RELEASED: "2"}
    assert released(2, ann, 1)
    assert not released(2, ann, 2), "the attempt it already ran"
    assert not released(3, ann, 1), "the annotation names an older attempt"
    assert not released(2, {}, 1)
    assert released(2, ann, None)


def test_state_round_trips_and_a_bad_file_is_a_first_start(tmp_path: Path) -> None:
    path = tmp_path / "s" / STATE_FILE
    assert State.load(path) == State(0, None)
    State(2, 5).save(path)
    assert State.load(path) == State(2, 5)
    assert [p.name for p in path.parent.iterdir()] == [STATE_FILE], "no temporary file left"
    path.write_text('{"starts": "x"}')
    assert State.load(path) == State(0, None)
    path.write_text("[1]")
    assert State.load(path) == State(0, None)


def test_a_first_start_runs_at_once_with_the_attempt_and_exits_with_its_code(pod: Pod) -> None:
    pod.labels(4)
    code = "import os, sys; print(os.environ['GPUJOB_ATTEMPT'], file=sys.stderr); sys.exit(3)"
    assert finish(pod.start(sys.executable, "-c", code)) == 3
    log = pod.log.read_text()
    assert "gpujob supervisor: running attempt 4" in log and "\n4\n" in log
    assert State.load(pod.state / STATE_FILE) == State(1, 4)


def test_no_podinfo_is_attempt_zero_and_leftovers_of_the_child_are_killed(pod: Pod) -> None:
    p = pod.child("leave-grandchild")
    rec = pod.ran()
    assert rec["attempt"] == "0"
    assert finish(p) == 5
    grandchild = int(str(rec["grandchild"]))
    wait_until(lambda: not alive(grandchild), DEADLINE, "the grandchild to be killed")


def test_a_restart_waits_for_the_operator_then_runs_the_next_attempt(pod: Pod) -> None:
    State(1, 0).save(pod.state / STATE_FILE)
    pod.labels(0)
    pod.release(0)
    p = pod.child()
    pod.said("restarted in place after attempt 0")
    # The barrier holds: no fixed sleep synchronises anything here, it only gives the
    # supervisor many polls in which it must not start the child.
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.3)
    assert not pod.marker.exists()
    pod.labels(1)  # relabelled, but the release still names the old attempt
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.3)
    assert not pod.marker.exists()
    pod.release(1)
    assert pod.ran()["attempt"] == "1"
    assert "released: running attempt 1" in pod.log.read_text()
    assert State.load(pod.state / STATE_FILE) == State(2, 1)


def test_a_later_attempt_stops_the_run_and_its_group_and_exits_to_restart(pod: Pod) -> None:
    pod.labels(2)
    p = pod.child("grandchild")  # the grandchild ignores SIGTERM: the group SIGKILL ends it
    rec = pod.ran()
    pod.labels(3)
    assert finish(p) == contract.RESTART_EXIT_CODE
    assert "the pod moved to attempt 3: stopping attempt 2" in pod.log.read_text()
    pids = [int(str(rec["pid"])), int(str(rec["grandchild"]))]
    wait_until(lambda: not any(alive(pid) for pid in pids), DEADLINE, f"{pids} to be gone")


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(pod: Pod) -> None:
    pod.labels(0)
    p = pod.start(sys.executable, "-c", CHILD, str(pod.marker), "ignore-term", grace=0.3)
    rec = pod.ran()
    pod.podinfo.joinpath("labels").unlink()  # unreadable: no change, the run goes on
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    pod.labels(1)
    assert finish(p) == contract.RESTART_EXIT_CODE
    assert not alive(int(str(rec["pid"])))


def test_sigterm_reaches_the_child_and_the_supervisor_exits_with_its_code(pod: Pod) -> None:
    p = pod.child()
    rec = pod.ran()
    p.send_signal(signal.SIGTERM)
    assert finish(p) == 128 + signal.SIGTERM
    assert not alive(int(str(rec["pid"])))


def test_sigterm_while_waiting_for_the_operator_exits_at_once(pod: Pod) -> None:
    State(1, 0).save(pod.state / STATE_FILE)
    p = pod.child()
    pod.said("waiting for the operator")
    p.send_signal(signal.SIGTERM)
    assert finish(p) == 128 + signal.SIGTERM
    assert not pod.marker.exists()


@pytest.mark.parametrize("args", [["true"], ["--poll=1", "--"]])
def test_a_usage_error_exits_2(pod: Pod, args: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-m", contract.SUPERVISOR_MODULE, *args],
        env={**os.environ, "PYTHONPATH": str(REPO / "trainer_image")},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert r.returncode == 2
    assert "command" in r.stderr and "--" in r.stderr


def annotate(pod: Pod, values: dict[str, str]) -> None:
    write_downward(pod.podinfo, "annotations", values)


def test_a_restart_the_operator_counts_on_comes_at_once_even_at_the_barrier(pod: Pod) -> None:
    State(1, 0).save(pod.state / STATE_FILE)
    pod.labels(1)
    annotate(pod, {contract.ANNOTATION_RESTARTS_BASE: "2"})  # one start more than this one
    p = pod.child()
    assert finish(p) == contract.RESTART_EXIT_CODE
    assert not pod.marker.exists()
    assert State.load(pod.state / STATE_FILE).starts == 2, "that start counts"
    # The restart that follows is the one it counted on: it waits for the release.
    q = pod.child()
    pod.said("waiting for the operator")
    annotate(pod, {contract.ANNOTATION_RESTARTS_BASE: "2", contract.ANNOTATION_RELEASED: "1"})
    assert pod.ran()["attempt"] == "1"
    q.kill()


def test_a_pod_created_during_an_in_place_restart_waits_for_the_release(pod: Pod) -> None:
    pod.labels(4)
    annotate(pod, {contract.ANNOTATION_HOLD: "true"})
    p = pod.child()
    pod.said("created during an in-place restart")
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.3)
    assert not pod.marker.exists()
    annotate(pod, {contract.ANNOTATION_HOLD: "true", contract.ANNOTATION_RELEASED: "4"})
    assert pod.ran()["attempt"] == "4"


def test_a_command_exiting_with_the_reserved_code_is_reported_as_1(pod: Pod) -> None:
    p = pod.start(sys.executable, "-c", f"import sys; sys.exit({contract.RESTART_EXIT_CODE})")
    assert finish(p) == 1
    assert "reserved" in pod.log.read_text()
