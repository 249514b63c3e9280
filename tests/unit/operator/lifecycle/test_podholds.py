"""What a pod holds, as kube-scheduler and the quota count it (lifecycle/gang/podholds.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gpujob_operator.lifecycle.gang import podholds

GPU = "nvidia.com/gpu"


def ctr(name: str, sidecar: bool = False, **res: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": res}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(containers: list[Any], init: list[Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": containers, "initContainers": init or [], **spec}}


def d(**values: Any) -> dict[str, Decimal]:
    return {k.replace("_", "/"): Decimal(str(v)) for k, v in values.items()}


def test_app_containers_add_up_and_a_request_defaults_to_its_limit() -> None:
    p = pod(
        [
            ctr("a", requests={"cpu": "500m", "memory": "1Gi"}),
            ctr("b", requests={"cpu": "1"}, limits={"cpu": "2", GPU: 2}),
        ]
    )
    assert podholds.requests(p) == {"cpu": Decimal("1.5"), "memory": 2**30, GPU: 2}
    assert podholds.limits(p) == {"cpu": 2, GPU: 2}


def test_an_init_container_runs_alone_beside_the_sidecars_started_before_it() -> None:
    """The KEP 753 example: the pod holds max(app + sidecars, each init + sidecars before)."""
    p = pod(
        [ctr("app", requests={"cpu": "1", GPU: 1})],
        init=[
            ctr("first", requests={"cpu": "3"}),  # alone: 3
            ctr("log", sidecar=True, requests={"cpu": "500m", GPU: 1}),
            ctr("warm", requests={"cpu": "2", GPU: 4}),  # beside log: 2.5 cpu, 5 GPUs
        ],
    )
    assert podholds.requests(p) == {"cpu": 3, GPU: 5}
    # without the big init container, the sidecar adds to the app containers
    p["spec"]["initContainers"].pop()
    assert podholds.requests(p) == {"cpu": 3, GPU: 2}
    p["spec"]["initContainers"].pop(0)
    assert podholds.requests(p) == {"cpu": Decimal("1.5"), GPU: 2}


def test_pod_level_resources_replace_the_containers_sum_and_overhead_adds() -> None:
    p = pod(
        [ctr("a", requests={"cpu": "1", "memory": "1Gi", GPU: 1}, limits={GPU: 1})],
        resources={"requests": {"cpu": "4"}, "limits": {"memory": "8Gi", GPU: 9}},
        overhead={"cpu": "250m", "memory": "64Mi"},
    )
    # cpu from the pod level; memory from the containers (a pod-level limit becomes the
    # request only where no container asks); GPUs are never pod-level
    assert podholds.requests(p) == {"cpu": Decimal("4.25"), "memory": 2**30 + 64 * 2**20, GPU: 1}
    # limits: the pod level's memory, overhead only on a set limit
    assert podholds.limits(p) == {"memory": 8 * 2**30 + 64 * 2**20, GPU: 1}
    p["spec"]["containers"][0]["resources"]["requests"].pop("memory")
    assert podholds.requests(p)["memory"] == 8 * 2**30 + 64 * 2**20


def test_what_the_server_would_refuse_counts_as_absent() -> None:
    p = pod([ctr("a", requests={"cpu": "lots", "memory": "-1", GPU: "2"}), {"name": "bare"}])
    assert podholds.requests(p) == {GPU: 2}
    assert podholds.requests({}) == {} and podholds.limits({"spec": {"resources": []}}) == {}


def test_a_gangs_holdings_add_up() -> None:
    one = d(cpu="1.5", memory=2**30)
    assert podholds.summed([one, one, {GPU: Decimal(2)}]) == {**d(cpu=3, memory=2**31), GPU: 2}
