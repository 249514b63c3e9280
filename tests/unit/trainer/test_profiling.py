"""profiling.Profiler's states with a fake capture, the /debug/profile answers, the gauge, and
one real torch.profiler capture through a Tracker on CPU."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpujob_trainer import contract, exporter, profiling
from gpujob_trainer.env import RankInfo
from gpujob_trainer.hooks import optimizer_hooks
from gpujob_trainer.profiling import Profiler, RequestError, parse_request, trace_name
from gpujob_trainer.tracker import Tracker


def chrome_trace(steps: int) -> dict[str, Any]:
    """What torch exports for `steps` steps of one 60 us op in each 100 us step."""
    events: list[dict[str, Any]] = []
    for k in range(steps):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{k}",
                "pid": 1,
                "tid": 1,
                "ts": 100.0 * k,
                "dur": 100.0,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 100.0 * k + 10,
                "dur": 60.0,
            }
        )
    return {"schemaVersion": 1, "traceEvents": events}


class FakeCapture:
    def __init__(self, log: list[str], fail: str = "", trace: Any = None) -> None:
        self.log, self.fail, self.trace = log, fail, trace
        self.steps = 0

    def _maybe_fail(self, what: str) -> None:
        self.log.append(what)
        if self.fail == what:
            raise RuntimeError(f"{what} broke")

    def start(self) -> None:
        self._maybe_fail("start")

    def step(self) -> None:
        self.steps += 1
        self._maybe_fail("step")

    def stop(self) -> None:
        self._maybe_fail("stop")

    def export_chrome_trace(self, path: str) -> None:
        self._maybe_fail("export")
        trace = self.trace if self.trace is not None else chrome_trace(self.steps + 1)
        Path(path).write_text(json.dumps(trace) if not isinstance(trace, str) else trace)


class Rig:
    """A Profiler over a fake capture; the background work runs inline (or is kept)."""

    def __init__(self, tmp_path: Path, *, fail: str = "", trace: Any = None, defer: bool = False):
        self.armed = False
        self.log: list[str] = []
        self.cuda_asked: list[bool] = []
        self.deferred: list[Any] = []
        self.now = 1000.0

        def make(cuda: bool) -> FakeCapture:
            self.cuda_asked.append(cuda)
            self.capture = FakeCapture(self.log, fail, trace)
            return self.capture

        self.p = Profiler(
            rank=2,
            arm=self._arm,
            cuda=lambda: True,
            make=make,
            directory=lambda: tmp_path / "out",
            job="my job",
            wall=self._wall,
            background=self.deferred.append if defer else lambda work: work(),
        )

    def _arm(self, on: bool) -> None:
        self.armed = on

    def _wall(self) -> float:
        self.now += 1.0
        return self.now

    def ticks(self, n: int, optimizer: Any = 1) -> None:
        for _ in range(n):
            assert self.armed
            self.p.tick(optimizer)


def test_a_capture_runs_its_steps_then_summarises(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.p
    idle = p.state()
    assert (idle["version"], idle["rank"], idle["state"], idle["id"]) == (1, 2, "idle", None)
    doc = p.request("a", 3)
    assert doc["state"] == "pending" and doc["steps"] == 3 and doc["requestedAt"] == 1001.0
    assert rig.armed and rig.log == []
    rig.ticks(1)  # the next boundary starts it
    assert p.state()["state"] == "capturing" and rig.log == ["start"]
    assert rig.cuda_asked == [True]
    rig.ticks(2)
    assert p.state()["stepsDone"] == 2 and rig.log == ["start", "step", "step"]
    rig.ticks(1)  # the third step's end stops it; the summary runs "in the background"
    assert not rig.armed
    assert rig.log == ["start", "step", "step", "stop", "export"]
    done = p.state()
    assert done["state"] == "done" and done["stepsDone"] == 3 and done["error"] is None
    path = tmp_path / "out" / "my_job-rank2-a.pt.trace.json"
    assert done["trace"] == str(path.resolve()) and done["traceBytes"] == path.stat().st_size
    assert not list((tmp_path / "out").glob("*.partial"))
    s = done["summary"]
    assert s["steps"] == 3 and s["rank"] == 2 and s["top"][0]["name"] == "aten::mm"
    assert s["parts"]["compute"] == pytest.approx(60e-6)
    assert p.latest_parts == s["parts"]
    assert done["startedAt"] < done["finishedAt"]
    # The same id again is the same capture (polling); a new id starts a new one.
    assert p.request("a", 3) == done
    assert p.request("b", 1)["state"] == "pending" and rig.armed
    assert p.state()["summary"] is None and p.latest_parts == s["parts"]  # the gauge stays


def test_another_id_while_one_is_in_flight_is_busy(tmp_path: Path) -> None:
    rig = Rig(tmp_path, defer=True)
    p = rig.p
    p.request("a", 1)
    for state in ("pending", "capturing", "summarizing"):
        busy = p.request("b", 5)
        assert busy["state"] == "busy" and busy["busyWith"] == "a" and busy["id"] == "a"
        assert p.state()["state"] == state
        if state != "summarizing":
            rig.ticks(1)
    rig.deferred.pop()()  # the background thread's work
    assert p.state()["state"] == "done"
    assert p.request("b", 5)["state"] == "pending"


def test_an_iteration_is_one_boundary_however_it_ends(tmp_path: Path) -> None:
    rig = Rig(tmp_path, defer=True)
    p = rig.p
    p.request("a", 3)
    # A GAN: two optimizers an iteration, then end_step(): the first optimizer draws them.
    for _ in range(3):
        p.tick(10)
        p.tick(20)
        p.tick(None)
    assert p.state()["stepsDone"] == 2 and p.state()["state"] == "capturing"
    # A loop with no optimizer hooks: end_step() alone draws them.
    p2 = Rig(tmp_path, defer=True)
    p2.p.request("a", 2)
    p2.ticks(3, optimizer=None)
    assert p2.p.state()["state"] == "summarizing"


@pytest.mark.parametrize(
    ("fail", "why"),
    [
        ("start", "the profiler did not start: RuntimeError: start broke"),
        ("step", "the profiler failed at step 1: RuntimeError: step broke"),
        ("stop", "the profiler failed at step 2: RuntimeError: stop broke"),
        ("export", "the trace export failed: RuntimeError: export broke"),
    ],
)
def test_a_failure_anywhere_is_the_state_failed_with_why(
    tmp_path: Path, fail: str, why: str
) -> None:
    rig = Rig(tmp_path, fail=fail)
    rig.p.request("a", 2)
    rig.p.tick(1)
    if rig.armed:
        rig.p.tick(1)
    if rig.armed:
        rig.p.tick(1)
    doc = rig.p.state()
    assert doc["state"] == "failed" and doc["error"] == why and not rig.armed
    assert doc["summary"] is None and doc["finishedAt"] is not None
    assert rig.p.latest_parts is None
    assert rig.p.request("b", 1)["state"] == "pending"  # a failed capture is not in flight


def test_a_trace_without_steps_or_not_json_fails_the_summary(tmp_path: Path) -> None:
    rig = Rig(tmp_path, trace={"traceEvents": []})
    rig.p.request("a", 1)
    rig.ticks(2)
    doc = rig.p.state()
    assert doc["state"] == "failed" and "ProfilerStep" in doc["error"]
    assert doc["trace"] is not None  # the trace is kept for whoever wants to look
    rig = Rig(tmp_path, trace="{not json")
    rig.p.request("b", 1)
    rig.ticks(2)
    error = rig.p.state()["error"]
    assert error.startswith("the summary failed: ") and "JSONDecodeError" in error, error


def test_a_trace_over_the_bound_is_kept_and_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiling, "MAX_TRACE_BYTES", 100)
    rig = Rig(tmp_path)
    rig.p.request("a", 1)
    rig.ticks(2)
    doc = rig.p.state()
    assert doc["state"] == "failed" and "over the 100 the rank reads" in doc["error"]
    assert Path(doc["trace"]).exists() and doc["traceBytes"] > 100


def test_training_that_ends_mid_capture_fails_it_and_stops_the_profiler(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.p.request("a", 5)
    rig.ticks(3)
    rig.p.close()
    doc = rig.p.state()
    assert doc["state"] == "failed" and doc["error"] == "training ended after 2 of 5 steps"
    assert rig.log[-1] == "stop" and not rig.armed
    pending = Rig(tmp_path)
    pending.p.request("a", 5)
    pending.p.close()
    assert pending.p.state()["error"] == "training ended before the capture started"
    after = pending.p.request("b", 5)  # nothing left to profile
    assert after["state"] == "failed" and "training is over" in after["error"]
    assert not pending.armed


def test_errors_are_bounded(tmp_path: Path) -> None:
    rig = Rig(tmp_path)

    def make(cuda: bool) -> Any:
        raise RuntimeError("x" * 10_000)

    rig.p._make = make
    rig.p.request("a", 1)
    rig.p.tick(1)
    assert len(rig.p.state()["error"]) == profiling.MAX_ERROR


def test_unavailable_answers_why(tmp_path: Path) -> None:
    p = Profiler(rank=0, arm=lambda on: None, available="profiling is off (GPUJOB_PROFILE=0)")
    for doc in (p.state(), p.request("a", 5)):
        assert doc["state"] == "unavailable" and doc["error"].startswith("profiling is off")
    assert profiling.why_unavailable({contract.ENV_PROFILE: "0"}) == (
        "profiling is off (GPUJOB_PROFILE=0)"
    )
    assert profiling.why_unavailable({}) is None  # torch is installed here


@pytest.mark.parametrize(
    ("query", "want"),
    [
        ({}, None),
        ({"id": ["abc"]}, ("abc", contract.PROFILE_DEFAULT_STEPS)),
        ({"id": ["a.B-9_z"], "steps": ["50"]}, ("a.B-9_z", 50)),
        ({"id": ["x"], "steps": ["1"]}, ("x", 1)),
        ({"id": ["x" * 64], "steps": [" 7 "]}, ("x" * 64, 7)),
    ],
)
def test_requests_parse(query: dict[str, list[str]], want: Any) -> None:
    assert parse_request(query) == want


@pytest.mark.parametrize(
    "query",
    [
        {"id": ["x"], "steps": ["0"]},
        {"id": ["x"], "steps": ["51"]},
        {"id": ["x"], "steps": ["-1"]},
        {"id": ["x"], "steps": ["2.5"]},
        {"id": ["x"], "steps": ["five"]},
        {"id": ["x"], "steps": ["9" * 100]},
        {"id": [""], "steps": ["5"]},
        {"id": ["x" * 65]},
        {"id": ["a/b"]},
        {"id": ["a b"]},
        {"steps": ["5"]},
    ],
)
def test_bad_requests_are_refused(query: dict[str, list[str]]) -> None:
    with pytest.raises(RequestError):
        parse_request(query)


def test_trace_names_and_the_default_directory(tmp_path: Path) -> None:
    assert trace_name(None, 3, "abc") == "local-rank3-abc.pt.trace.json"
    assert trace_name("train/x y", 0, "i") == "train_x_y-rank0-i.pt.trace.json"
    assert profiling.profile_dir({contract.ENV_PROFILE_DIR: str(tmp_path)}) == tmp_path
    assert profiling.profile_dir({}).name == "gpujob-profiles"


def call(app: Any, path: str, query: str = "", auth: str | None = None) -> tuple[str, Any, Any]:
    environ: dict[str, Any] = {
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "REQUEST_METHOD": "GET",
        "wsgi.input": io.BytesIO(),
    }
    if auth:
        environ["HTTP_AUTHORIZATION"] = auth
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"], got["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def test_the_endpoint_answers_json_guarded_by_the_token(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    app = exporter._app(CollectorRegistry(), 2, True, "s3cret", rig.p)
    status, _, _ = call(app, contract.PROFILE_PATH, "id=a&steps=2")
    assert status.startswith("401") and rig.p.state()["state"] == "idle"  # nothing started
    bearer = "Bearer s3cret"
    status, headers, body = call(app, contract.PROFILE_PATH, "id=a&steps=2", bearer)
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body) <= exporter.MAX_PROFILE_ANSWER
    assert json.loads(body)["state"] == "pending"
    status, _, body = call(app, contract.PROFILE_PATH, "", bearer)
    assert json.loads(body)["id"] == "a"
    status, headers, body = call(app, contract.PROFILE_PATH, "id=a&steps=0", bearer)
    assert status.startswith("400") and headers["Content-Type"] == "application/json"
    assert "steps must be an integer from 1 to 50" in json.loads(body)["error"]
    many = "&".join(f"k{i}=v" for i in range(40))
    status, _, body = call(app, contract.PROFILE_PATH, many, bearer)
    assert status.startswith("400") and json.loads(body)["error"]


def test_evidence_off_answers_404_and_no_profiler_unavailable(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    off = exporter._app(CollectorRegistry(), 2, False, None, rig.p)
    status, headers, body = call(off, contract.PROFILE_PATH, "id=a&steps=2")
    assert status.startswith("404") and headers["Content-Type"] == "application/json"
    assert json.loads(body)["state"] == "unavailable" and rig.p.state()["state"] == "idle"
    none = exporter._app(CollectorRegistry(), 2, True, None, None)
    status, _, body = call(none, contract.PROFILE_PATH, "id=a&steps=2")
    assert status == "200 OK" and json.loads(body)["state"] == "unavailable"


def test_the_gauge_shows_the_latest_finished_parts() -> None:
    rank = RankInfo(rank=5, local_rank=1, node_rank=2)
    assert exporter.render_profile(rank, None) == []
    parts = {"compute": 0.5, "communication": 0.25, "copy": 0.0, "idle": 0.25}
    (fam,) = exporter.render_profile(rank, parts)
    got = {s.labels["part"]: s.value for s in fam.samples}
    assert got == parts
    assert fam.samples[0].labels == {
        "rank": "5",
        "local_rank": "1",
        "node_rank": "2",
        "part": "compute",
    }


def test_no_request_no_tick_on_the_hot_path() -> None:
    """Outside a capture the optimizer hook reads one flag and calls nothing."""
    t = Tracker(rank=RankInfo(), hook_optimizers=False)

    def boom(optimizer: Any) -> None:
        raise AssertionError("ticked without a request")

    t._profile_tick = boom  # type: ignore[method-assign]
    t.profiler.tick = boom  # type: ignore[method-assign]
    pre, post = optimizer_hooks(t, watched=True)
    for _ in range(3):
        pre(object(), (), {})
        post(object(), (), {})
        t.end_step()
    t.close()


def test_a_real_capture_through_the_tracker_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv(contract.ENV_PROFILE_DIR, str(tmp_path))
    t = Tracker(rank=RankInfo(rank=1))
    done = threading.Event()
    finished = t.profiler._finished

    def spy(*args: Any, **kwargs: Any) -> None:
        finished(*args, **kwargs)
        done.set()

    t.profiler._finished = spy  # type: ignore[method-assign]
    model = t.wrap_model(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    assert t.profiler.request("cpu1", 3)["state"] == "pending"
    for _ in range(4):  # the boundary that starts it, then three steps
        step()
    assert not t._profiling
    assert done.wait(60), t.profiler.state()
    doc = t.profiler.state()
    assert doc["state"] == "done", doc
    assert doc["trace"] == str(tmp_path.resolve() / "local-rank1-cpu1.pt.trace.json")
    s = doc["summary"]
    assert s["steps"] == 3 and s["device"] == "cpu" and s["rank"] == 1
    assert sum(s["parts"].values()) == pytest.approx(s["stepSeconds"], rel=1e-9)
    registry = CollectorRegistry()
    registry.register(exporter.TrainerCollector(t))
    text = generate_latest(registry).decode()
    assert 'gpujob_profile_step_seconds{local_rank="0",node_rank="0",part="idle",rank="1"}' in text
    t.close()


def test_the_state_answers_while_the_profiler_starts_or_stops(tmp_path: Path) -> None:
    """The profiler's start and stop can take seconds (stop gathers every event): the HTTP
    thread answering the operator's polls must not wait for them behind the lock."""
    import threading

    rig = Rig(tmp_path)
    inside, release = threading.Event(), threading.Event()
    real_make = rig.p._make

    def slow_make(cuda: bool) -> Any:
        capture = real_make(cuda)
        original = capture.start

        def start() -> None:
            inside.set()
            assert release.wait(30)
            original()

        capture.start = start  # type: ignore[method-assign]
        return capture

    rig.p._make = slow_make
    rig.p.request("a", 1)
    training = threading.Thread(target=rig.p.tick, args=(1,))
    training.start()
    assert inside.wait(30)
    answered: list[str] = []
    reader = threading.Thread(target=lambda: answered.append(rig.p.state()["state"]))
    reader.start()
    reader.join(10)
    done = not reader.is_alive()
    release.set()
    training.join(30)
    assert done and answered == ["pending"], answered
    assert rig.p.state()["state"] == "capturing"


def test_a_capture_that_never_sees_a_step_expires_and_frees_the_rank(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.p.request("a", 2)
    assert rig.p.request("b", 2)["state"] == "busy"
    rig.now += 4000.0  # no step came for over an hour: the operator gave up long ago
    doc = rig.p.request("b", 2)
    assert doc["state"] == "pending" and doc["id"] == "b", doc


def test_only_the_newest_traces_of_a_rank_are_kept(tmp_path: Path) -> None:
    """Each capture writes a trace; the folder keeps this rank's newest three (and never a
    half-written one), so asking again and again never fills the pod's disk."""
    out = tmp_path / "out"
    out.mkdir()
    other = out / "my_job-rank7-x.pt.trace.json"  # another rank's: not ours to delete
    other.write_text("{}")
    (out / "my_job-rank2-old.pt.trace.json.partial").write_text("{")
    rig = Rig(tmp_path)
    for n in range(5):
        rig.p.request(f"c{n}", 1)
        rig.ticks(2)
        assert rig.p.state()["state"] == "done"
    mine = sorted(p.name for p in out.glob("*-rank2-*"))
    assert mine == [f"my_job-rank2-c{n}.pt.trace.json" for n in (2, 3, 4)], mine
    assert other.exists()


def test_the_summary_is_computed_apart_from_the_training_process(tmp_path: Path) -> None:
    """A child Python reads the trace: the rank's GIL and heap never hold the parse. Its
    answer is the in-process summary's; its failure says why in one line."""
    from gpujob_trainer import profilesummary, profiling

    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(chrome_trace(3)))
    apart = profiling.summarize_apart(str(trace), 4, 2)
    assert apart == profilesummary.summarize_file(str(trace), rank=4, requested_steps=2)
    trace.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(profilesummary.SummaryError, match=r"^the trace holds no ProfilerStep#"):
        profiling.summarize_apart(str(trace), 4, 2)
