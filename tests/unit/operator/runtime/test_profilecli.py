"""``gpujob profile``: checked before any call, the annotation set, the answer awaited (the
API injected; no network, no sleeping)."""

from __future__ import annotations

import argparse
import io
from collections.abc import Mapping
from typing import Any

import pytest

from gpujob_operator import cli
from gpujob_operator.runtime import profilecli


class FakeApi:
    """A job whose status the test's script moves on at each read after the annotation."""

    def __init__(self, job: dict[str, Any] | None, script: list[dict[str, Any]] | None = None):
        self.job = job
        self.script = list(script or [])
        self.calls: list[tuple[str, ...]] = []
        self.data: dict[str, dict[str, str]] = {}

    def get_job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append(("get", namespace, name))
        if self.job is not None and self.script and any(c[0] == "annotate" for c in self.calls):
            self.job = {**self.job, "status": {**self.job["status"], **self.script.pop(0)}}
        return self.job

    def annotate(
        self, namespace: str, name: str, key: str, value: str, resource_version: str | None = None
    ) -> bool | None:
        self.calls.append(("annotate", namespace, name, key, value))
        return None

    def configmap_data(self, namespace: str, name: str) -> Mapping[str, str] | None:
        self.calls.append(("configmap", namespace, name))
        return self.data.get(name)


def job(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {"image": "i", "command": ["python", "t.py"], "nodes": 2},
        "status": {"phase": "Running", "gang": {"attempt": 1}, **status},
    }


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    profilecli.add_arguments(p)
    return p.parse_args(["j", "-n", "ns", *argv])


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def call(api: FakeApi, *argv: str) -> tuple[int, str, str]:
    out, err, clock = io.StringIO(), io.StringIO(), Clock()
    rc = profilecli.run(
        args(*argv), api, out=out, err=err, clock=clock, sleep=clock.sleep, new_id=lambda: "cafe01"
    )
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--steps", "0"), "steps must be an integer from 1 to 50"),
        (("--steps", "51"), "from 1 to 50"),
        (("--ranks", "0,x"), "ranks must be all, slowest or a comma list"),
        (("--ranks", "1,1"), "names a rank twice"),
        (("--ranks", "all;steps=3"), "steps is given twice"),
    ],
)
def test_a_bad_request_is_refused_before_any_api_call(argv: tuple[str, ...], words: str) -> None:
    api = FakeApi(job())
    rc, _, err = call(api, *argv)
    assert rc == 2 and words in err and api.calls == []


def test_a_request_the_job_cannot_take_is_refused_before_the_write() -> None:
    api = FakeApi(job())
    rc, _, err = call(api, "--ranks", "0,13")
    assert rc == 2 and "rank 13 does not exist: the job has 2 ranks" in err
    assert [c[0] for c in api.calls] == ["get"]


def test_a_finished_job_is_refused() -> None:
    rc, _, err = call(FakeApi(job(phase="Succeeded")))
    assert rc == 2 and "finished" in err


def test_a_capture_under_way_is_refused() -> None:
    rc, _, err = call(FakeApi(job(profile={"id": "x", "state": "Capturing", "request": "id=x"})))
    assert rc == 2 and "under way" in err


def test_a_missing_job_is_an_error() -> None:
    rc, _, err = call(FakeApi(None))
    assert rc == 1 and "not found" in err


def test_the_annotation_is_set_with_a_fresh_id() -> None:
    api = FakeApi(job())
    rc, out, _ = call(api, "--steps", "7", "--ranks", "all")
    assert rc == 0
    assert ("annotate", "ns", "j", "gpujob.dev/profile", "steps=7;ranks=all;id=cafe01") in api.calls
    assert "steps=7;ranks=all;id=cafe01" in out


def test_wait_prints_the_answer_and_the_table() -> None:
    answer = "rank 1: aten::mm 74% vs 59% on the median rank (rank 0)"
    requested = {"profile": {"id": "cafe01", "state": "Requested", "request": "r"}}
    captured = {
        "profile": {
            "id": "cafe01",
            "state": "Captured",
            "answer": answer,
            "path": "/var/run/gpujob/profiles",
            "ranks": [0, 1],
            "configMap": "j-profile-1-cafe01",
        }
    }
    api = FakeApi(job(), [requested, requested, captured])
    api.data["j-profile-1-cafe01"] = {"summary": answer + "\n\n  rank  step ...\n     1 [####]\n"}
    rc, out, _ = call(api, "--wait")
    assert rc == 0
    assert answer in out and "[####]" in out and "configmap: j-profile-1-cafe01" in out
    assert out.count(answer) == 1


def test_wait_reports_a_refusal_of_this_request() -> None:
    refused = {
        "profile": {
            "id": "other",
            "state": "Capturing",
            "refused": {"id": "cafe01", "reason": "a capture (id other) is under way"},
        }
    }
    rc, _, err = call(FakeApi(job(), [refused]), "--wait")
    assert rc == 2 and "under way" in err


def test_wait_reports_a_failure() -> None:
    failed = {"profile": {"id": "cafe01", "state": "Failed", "reason": "no rank gave a profile"}}
    rc, out, _ = call(FakeApi(job(), [failed]), "--wait")
    assert rc == 1 and "no rank gave a profile" in out


def test_wait_gives_up_at_the_deadline_without_sleeping() -> None:
    other = {"profile": {"id": "someone-else", "state": "Captured"}}
    api = FakeApi(job(), [other] * 1000)
    rc, _, err = call(api, "--wait", "--timeout", "10", "--poll", "2")
    assert rc == 124 and "no answer within 10s" in err
    assert 5 <= sum(1 for c in api.calls if c[0] == "get") <= 8


def test_the_cli_knows_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["profile", "--help"])
    assert e.value.code == 0 and "--steps" in capsys.readouterr().out


def test_a_request_still_waiting_for_the_operator_is_not_overwritten() -> None:
    """Two people asking at once: the second sees the first's request waiting and is
    refused, instead of replacing it before the operator saw it."""
    waiting = job()
    waiting["metadata"]["annotations"] = {"gpujob.dev/profile": "steps=5;id=first"}
    api = FakeApi(waiting)
    rc, _, err = call(api)
    assert rc == 2 and "another request (steps=5;id=first) waits for the operator" in err
    assert [c[0] for c in api.calls] == ["get"]
    # once the operator acted on it (accepted or refused), a new request goes through
    waiting["status"]["operatorState"] = {"profileRequest": "steps=5;id=first"}
    rc, _, err = call(api)
    assert rc == 0, err


def test_a_job_that_changed_since_it_was_read_is_read_again() -> None:
    class Moving(FakeApi):
        def annotate(self, *a: Any, **k: Any) -> bool | None:
            super().annotate(*a[:4])
            return len([c for c in self.calls if c[0] == "annotate"]) > 2

    api = Moving(job())
    rc, _, _ = call(api)
    assert rc == 0 and [c[0] for c in api.calls] == ["get", "annotate"] * 3
