"""The kopf handlers keep the operator's state in kopf's memo, shared by every object's copy."""

from __future__ import annotations

import copy
from typing import Any, cast

import kopf
import pytest

from gpujob_operator.api import children
from gpujob_operator.runtime import handlers
from gpujob_operator.runtime.jobloop import JobLoop
from gpujob_operator.runtime.settings import Settings


def _loop() -> JobLoop:
    loop = JobLoop(kube=cast(Any, object()), post_event=lambda *a: None)
    loop.body = {"metadata": {"namespace": "ml", "name": "bert", "uid": "u1"}}
    return loop


def test_every_object_s_copy_of_the_memo_shares_one_operator_state() -> None:
    """kopf hands each object's handlers a shallow copy of the operator's memo: a loop one
    handler starts, and what another handler marks, every other handler sees."""
    memo = handlers.install(Settings(), ["ml"], "replica-a")
    own = handlers.state(memo)
    assert own.identity == "replica-a" and own.namespaces == ["ml"]
    job_memo, pod_memo = copy.copy(memo), copy.copy(memo)  # as kopf makes them
    loop = handlers.state(job_memo).loops[("ml", "bert")] = _loop()
    pod = {
        "metadata": {
            "name": "bert-node-0",
            "namespace": "ml",
            "uid": "p1",
            "labels": {children.LABEL_JOB_NAME: "bert"},
        }
    }
    handlers.state(pod_memo).pods_changed(own.pods.apply("ADDED", pod), pod)
    assert loop.wake.is_set()
    assert own.job_pods(("ml", "bert"))() == [pod]
    assert not own.served  # only a job handed over marks it (the standby guard's demotion)
    own.forget(loop)
    assert handlers.state(job_memo).loops == {}


def test_the_startup_handler_configures_kopf_from_the_memo_s_settings() -> None:
    memo = handlers.install(Settings(worker_limit=7, watch_server_timeout=60), [], "me")
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=memo)
    assert settings.batching.worker_limit == 7
    assert settings.watching.client_timeout == 90
    assert settings.peering.standalone


def test_a_memo_without_the_state_fails_by_name_and_start_up_fills_the_defaults() -> None:
    """Only start-up (the operator's own memo, before kopf copies it) may fill the state:
    a state made in one object's copy would be seen by that object alone."""
    with pytest.raises(RuntimeError, match=handlers.MEMO_KEY):
        handlers.state(kopf.Memo())
    bare = kopf.Memo()  # `kopf run` of the module, without main
    handlers.configure(settings=kopf.OperatorSettings(), memo=bare)
    assert handlers.state(bare).settings == Settings()
