"""restartPolicy, the crash-loop back-off and the pod phase, as the kubelet computes them."""

from __future__ import annotations

import pytest

from gpujob_localcluster.restarts import (
    BackOff,
    ContainerFate,
    backoff_message,
    go_duration,
    pod_phase,
    should_restart,
)


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 137, True),
        ("Never", 1, False),
    ],
)
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert should_restart(policy, code) is restart


def test_backoff_doubles_from_ten_seconds_to_five_minutes() -> None:
    b, now, waits = BackOff(), 0.0, []
    for _ in range(8):
        wait = b.wait_after(now)
        waits.append(wait)
        now += wait
        b.restarted(now)
        now += 1  # the container crashes a second after each start
    assert waits == [0, 10, 20, 40, 80, 160, 300, 300]


def test_backoff_resets_after_running_twice_the_cap() -> None:
    b = BackOff()
    b.restarted(0)
    b.restarted(11)
    assert b.wait_after(12) == 20
    assert b.wait_after(11 + 601) == 0  # ran for more than 10 minutes: no wait
    b.restarted(11 + 601)
    assert b.current == 10


def test_phase() -> None:
    running = ContainerFate(running=True)
    assert pod_phase([running, ContainerFate(False, 0)]) == "Running"
    assert pod_phase([ContainerFate(False, 1, restarting=True)]) == "Running"
    assert pod_phase([ContainerFate(False, 0), ContainerFate(False, 0)]) == "Succeeded"
    assert pod_phase([ContainerFate(False, 0), ContainerFate(False, 2)]) == "Failed"
    assert pod_phase([]) == "Pending"


def test_messages_read_like_the_kubelets() -> None:
    assert go_duration(10) == "10s" and go_duration(80) == "1m20s" and go_duration(300) == "5m0s"
    assert (
        backoff_message(40, "main", "p", "ns", "u1")
        == "back-off 40s restarting failed container=main pod=p_ns(u1)"
    )


def test_pod_phase_with_init_containers_and_sidecars() -> None:
    ok = ContainerFate(False, 0)
    assert pod_phase([ContainerFate(False)], initialized=False) == "Pending"
    # An init container failed for good: Failed once the sidecars are stopped.
    assert pod_phase([ContainerFate(False)], initialized=False, init_failed=True) == "Failed"
    assert (
        pod_phase([ContainerFate(False)], init_failed=True, others_alive=True, initialized=False)
        == "Pending"
    )
    # The regular containers decide; a sidecar still being stopped only delays the end.
    assert pod_phase([ok], others_alive=True) == "Running"
    assert pod_phase([ok]) == "Succeeded"
    assert pod_phase([ContainerFate(True)], others_alive=True) == "Running"


def rules(*pairs: tuple[str, str, list[int]]) -> dict[str, object]:
    return {
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {"action": a, "exitCodes": {"operator": op, "values": v}} for a, op, v in pairs
        ],
    }


def test_the_first_matching_restart_rule_decides() -> None:
    from gpujob_localcluster.restarts import RESTART, RESTART_ALL, rule_action

    spec = rules((RESTART_ALL, "In", [42, 43]), (RESTART, "NotIn", [0]))
    assert rule_action(spec, 42) == RESTART_ALL
    assert rule_action(spec, 1) == RESTART, "the second rule: any failure"
    assert rule_action(spec, 0) is None
    assert rule_action({}, 42) is None


def test_a_container_restarts_by_its_rule_then_its_own_policy_then_the_pods() -> None:
    from gpujob_localcluster.restarts import RESTART, RESTART_ALL, container_restart

    spec = rules((RESTART, "In", [7]), (RESTART_ALL, "In", [42]))
    assert container_restart(spec, "Always", 7) is True
    assert container_restart(spec, "Always", 42) is False, "the whole pod restarts instead"
    assert container_restart(spec, "Always", 1) is False, "its own Never, not the pod's Always"
    assert container_restart({}, "OnFailure", 1) is True
    assert container_restart({"restartPolicy": "OnFailure"}, "Never", 1) is True
