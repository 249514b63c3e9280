"""The order of a pod's init containers: plain ones to completion, sidecars once started."""

from __future__ import annotations

from gpujob_localcluster.initorder import InitFate, InitStep, incomplete, next_step


def test_no_init_containers_means_initialized() -> None:
    assert next_step([]) == InitStep(done=True)


def test_plain_init_containers_run_one_after_another_to_completion() -> None:
    fetch, check = InitFate("fetch", False), InitFate("check", False)
    assert next_step([fetch, check]) == InitStep(start="fetch")
    running = InitFate("fetch", False, attempted=True, started=True)
    assert next_step([running, check]) == InitStep()  # wait: check must not start yet
    done = InitFate("fetch", False, attempted=True, succeeded=True)
    assert next_step([done, check]) == InitStep(start="check")
    checked = InitFate("check", False, attempted=True, succeeded=True)
    assert next_step([done, checked]) == InitStep(done=True)
    assert incomplete([done, check]) == ["check"]


def test_a_failed_init_container_fails_the_pod_and_one_retrying_holds_it() -> None:
    later = InitFate("later", False)
    assert next_step([InitFate("a", False, attempted=True, failed=True), later]).failed
    retrying = InitFate("a", False, attempted=True)  # exited non-zero, restart pending
    assert next_step([retrying, later]) == InitStep()


def test_a_sidecar_lets_the_next_start_once_started_and_never_completes() -> None:
    after = InitFate("after", False)
    assert next_step([InitFate("proxy", True), after]) == InitStep(start="proxy")
    starting = InitFate("proxy", True, attempted=True)  # startupProbe not passed yet
    assert next_step([starting, after]) == InitStep()
    assert incomplete([starting, after]) == ["proxy", "after"]
    started = InitFate("proxy", True, attempted=True, started=True)
    assert next_step([started, after]) == InitStep(start="after")
    assert next_step([started]) == InitStep(done=True)
    assert incomplete([started]) == []
