"""profilesummary on small synthetic chrome traces: windows, lanes, nesting, kinds, bounds.

Times are microseconds as in torch's traces; the expected seconds are worked by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from gpujob_trainer import contract
from gpujob_trainer.profilesummary import SummaryError, kind_of, summarize

US = 1e-6
TRAIN = 100  # the training thread's tid
PID = 1


def x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: Any = TRAIN, pid: Any = PID):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def steps(*spans: tuple[float, float], cat: str = "user_annotation", tid: Any = TRAIN) -> list:
    return [x(f"ProfilerStep#{k}", s, d, cat, tid) for k, (s, d) in enumerate(spans)]


def adds_up(s: dict[str, Any]) -> None:
    assert set(s["parts"]) == set(contract.PROFILE_PARTS)
    assert sum(s["parts"].values()) == pytest.approx(s["stepSeconds"], rel=1e-9)
    assert all(v >= 0 for v in s["parts"].values())


def test_nested_ops_innermost_wins_and_self_time_ranks_the_top() -> None:
    trace = {
        "traceEvents": [
            *steps((0, 100), (100, 100)),
            x("aten::linear", 10, 50),
            x("aten::addmm", 20, 30),  # inside linear: linear's self time is 20
            x("aten::mm", 110, 60),
            x("DistributedDataParallel.forward", 5, 80, "user_annotation"),  # no op
        ]
    }
    s = summarize(trace, rank=3)
    assert (s["version"], s["rank"], s["steps"], s["device"]) == (1, 3, 2, "cpu")
    assert s["stepSeconds"] == pytest.approx(100 * US)
    assert s["stepsSeconds"] == pytest.approx([100 * US, 100 * US])
    assert s["parts"]["compute"] == pytest.approx(55 * US)  # (50 + 60) / 2 steps
    assert s["parts"]["idle"] == pytest.approx(45 * US)
    assert s["parts"]["communication"] == s["parts"]["copy"] == 0
    assert s["communicationSeconds"] == 0 and s["overlap"] is None
    assert [(t["name"], t["kind"]) for t in s["top"]] == [
        ("aten::mm", "compute"),
        ("aten::addmm", "compute"),
        ("aten::linear", "compute"),
    ]
    assert [t["seconds"] for t in s["top"]] == pytest.approx([30 * US, 15 * US, 10 * US])
    assert s["top"][0]["share"] == pytest.approx(0.3)
    adds_up(s)


def test_communication_on_another_thread_overlaps_compute() -> None:
    events = [
        *steps((0, 100)),
        x("aten::mm", 0, 60),
        x("gloo:all_reduce", 40, 50, "user_annotation", tid=7),  # gloo's own thread
        x("aten::copy_", 10, 5, tid=8),  # a thread without communication: not a lane
    ]
    s = summarize(events)
    assert s["parts"]["compute"] == pytest.approx(60 * US)
    assert s["parts"]["communication"] == pytest.approx(30 * US)  # 60..90: exposed
    assert s["parts"]["idle"] == pytest.approx(10 * US)
    assert s["communicationSeconds"] == pytest.approx(50 * US)
    assert s["overlap"] == pytest.approx(20 / 50)
    assert {t["name"]: t["kind"] for t in s["top"]} == {
        "aten::mm": "compute",
        "gloo:all_reduce": "communication",
    }
    adds_up(s)


def test_gpu_lanes_are_the_streams_and_the_window_is_the_gpu_steps() -> None:
    events = [
        # The host ran ahead: its annotations and ops are not where the GPU worked.
        *steps((-500, 100)),
        x("aten::mm", -490, 80),
        x("cudaLaunchKernel", -480, 5, "cuda_runtime"),
        # GPU: device 0, compute stream 7, NCCL stream 20.
        x("ProfilerStep#0", 0, 100, "gpu_user_annotation", tid=7, pid=0),
        x("sm90_xmma_gemm_f32f32", 0, 50, "kernel", tid=7, pid=0),
        x("Memcpy DtoD (Device -> Device)", 60, 10, "gpu_memcpy", tid=7, pid=0),
        x("Memset (Device)", 85, 10, "gpu_memset", tid=7, pid=0),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 50, "kernel", tid=20, pid=0),
    ]
    s = summarize(events)
    assert s["device"] == "cuda"
    assert s["stepSeconds"] == pytest.approx(100 * US)
    parts = s["parts"]
    assert parts["compute"] == pytest.approx(50 * US)
    assert parts["communication"] == pytest.approx(30 * US)  # 50..80
    assert parts["copy"] == pytest.approx(10 * US)  # the memcpy hid under the collective
    assert parts["idle"] == pytest.approx(10 * US)
    assert s["overlap"] == pytest.approx(20 / 50)
    kinds = {t["name"]: t["kind"] for t in s["top"]}
    assert kinds == {
        "sm90_xmma_gemm_f32f32": "compute",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "communication",
        "Memcpy DtoD (Device -> Device)": "copy",
        "Memset (Device)": "copy",
    }
    adds_up(s)


def test_without_gpu_step_annotations_the_host_steps_frame_the_gpu_work() -> None:
    events = [*steps((0, 100)), x("void gemm_kernel", 20, 40, "kernel", tid=7, pid=0)]
    s = summarize(events)
    assert s["device"] == "cuda"
    assert s["parts"]["compute"] == pytest.approx(40 * US)
    adds_up(s)


def test_work_under_a_collective_is_the_collective_and_children_stay_in_parents() -> None:
    events = [
        *steps((0, 100)),
        x("c10d::allreduce_", 0, 50),
        x("aten::empty", 10, 10),  # the collective's own bookkeeping: communication
        x("aten::add", 60, 20),
        x("aten::mul", 70, 20),  # outlives its parent: cut at 80
    ]
    s = summarize(events)
    assert s["parts"]["communication"] == pytest.approx(50 * US)
    assert s["parts"]["compute"] == pytest.approx(20 * US)
    assert s["parts"]["idle"] == pytest.approx(30 * US)
    top = {t["name"]: (t["kind"], t["seconds"]) for t in s["top"]}
    assert top["aten::empty"] == ("communication", pytest.approx(10 * US))
    assert top["c10d::allreduce_"] == ("communication", pytest.approx(40 * US))
    assert top["aten::mul"] == ("compute", pytest.approx(10 * US))
    assert top["aten::add"] == ("compute", pytest.approx(10 * US))
    adds_up(s)


def test_time_outside_the_window_is_not_counted() -> None:
    events = [
        *steps((100, 100)),
        x("aten::mm", 0, 150),  # half before the window
        x("aten::addmm", 190, 100),  # mostly after it
        x("aten::relu", 300, 10),  # after it
    ]
    s = summarize(events)
    assert s["parts"]["compute"] == pytest.approx(60 * US)
    assert {t["name"] for t in s["top"]} == {"aten::mm", "aten::addmm"}
    adds_up(s)


@pytest.mark.parametrize(
    ("name", "cat", "kind"),
    [
        ("ncclDevKernel_AllGather_RING_LL", "kernel", "communication"),
        ("ncclKernel_ReduceScatter_RING", "kernel", "communication"),
        ("nccl:all_reduce", "user_annotation", "communication"),
        ("gloo:all_reduce", "user_annotation", "communication"),
        ("c10d::broadcast_", "cpu_op", "communication"),
        ("record_param_comms", "cpu_op", "communication"),
        ("_c10d_functional::all_gather_into_tensor", "cpu_op", "communication"),
        ("c10d::barrier", "cpu_op", "communication"),
        ("c10d::send", "cpu_op", "communication"),
        ("aten::broadcast_tensors", "cpu_op", "compute"),
        ("aten::mm", "cpu_op", "compute"),
        ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "copy"),
        ("Memset (Device)", "gpu_memset", "copy"),
        ("void at::native::vectorized_elementwise_kernel", "kernel", "compute"),
        ("sendable_kernel", "kernel", "compute"),
    ],
)
def test_kinds(name: str, cat: str, kind: str) -> None:
    assert kind_of(name, cat) == kind


def test_garbage_events_are_skipped_never_raised_on() -> None:
    events: list[Any] = [
        *steps((0, 100)),
        x("aten::mm", 10, 20),
        "not an event",
        None,
        42,
        ["a", "list"],
        {"ph": "X", "name": "no ts", "dur": 5, "tid": TRAIN, "pid": PID},
        {"ph": "X", "name": "no dur", "ts": 5, "tid": TRAIN, "pid": PID},
        x("negative", 50, -10),
        x("nan", 50, math.nan),
        x("inf ts", math.inf, 5),
        x("string dur", 50, "5"),  # type: ignore[arg-type]
        x("bool ts", True, 5),  # type: ignore[arg-type]
        {"ph": "B", "name": "begin", "ts": 0, "tid": TRAIN, "pid": PID},
        {"ph": "M", "name": "thread_name", "args": {"name": "x"}},
        {"ts": 60, "dur": 10, "name": 12345, "cat": None, "tid": TRAIN, "pid": PID},  # no op
        {"ph": "X", "ts": 70, "dur": 10, "cat": "cpu_op", "tid": TRAIN, "pid": PID},  # no name
    ]
    s = summarize(events)
    assert s["parts"]["compute"] == pytest.approx(30 * US)
    assert {t["name"] for t in s["top"]} == {"aten::mm", "None"}
    adds_up(s)
    json.dumps(s)  # plain JSON


@pytest.mark.parametrize(
    ("trace", "why"),
    [
        ({}, "no traceEvents"),
        ({"traceEvents": "nope"}, "no traceEvents"),
        ("text", "no traceEvents"),
        ({"traceEvents": [x("aten::mm", 0, 10)]}, "no ProfilerStep"),
        ({"traceEvents": steps((5, 0))}, "span no time"),
        ({"traceEvents": steps((5, -1))}, "no ProfilerStep"),
    ],
)
def test_a_trace_without_steps_gives_no_summary(trace: Any, why: str) -> None:
    with pytest.raises(SummaryError, match=why):
        summarize(trace)


def test_bounds_steps_top_and_names() -> None:
    many = steps(*((k * 10.0, 10.0) for k in range(60)))
    ops = [x(f"op{k}" + "x" * 300, 5 + k * 10.0, 1.0 + k / 100) for k in range(60)]
    s = summarize([*many, *ops])
    assert s["steps"] == contract.PROFILE_MAX_STEPS  # the last 50
    assert len(s["stepsSeconds"]) == contract.PROFILE_MAX_STEPS
    assert len(s["top"]) == 10
    assert all(len(t["name"]) <= 200 for t in s["top"])
    assert s["top"][0]["name"].startswith("op59")
    assert len(json.dumps(s)) <= 16 * 1024
    adds_up(s)
    five = summarize([*many, *ops], requested_steps=5)
    assert five["steps"] == 5 and five["stepSeconds"] == pytest.approx(10 * US)


def test_steps_on_the_thread_holding_most_of_them() -> None:
    events = [
        *steps((0, 100), (100, 100)),
        x("ProfilerStep#0", 0, 500, "user_annotation", tid=9),  # a stray one elsewhere
        x("aten::mm", 0, 50),
    ]
    s = summarize(events)
    assert s["steps"] == 2 and s["stepSeconds"] == pytest.approx(100 * US)


def test_the_module_imports_no_torch() -> None:
    code = (
        "import sys, gpujob_trainer.profilesummary\n"
        "print(sorted({'torch', 'prometheus_client'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
