"""The Helm chart: lint and render in every mode, least-privilege RBAC, refusals of bad values."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpujob_operator.lifecycle.apiserver import podreview
from gpujob_operator.observability import alerts, dashboards, opfamilies
from tests.support.chart import (
    CHART,
    MODES,
    NAMESPACED,
    PROMETHEUS_PEER,
    find,
    helm,
    render,
    template,
    values_file,
)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_helm_lint_is_clean(mode: str, tmp_path: Any) -> None:
    f = values_file(MODES[mode], tmp_path)
    res = helm("lint", str(CHART), "--strict", "-f", str(f))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout, res.stdout


@pytest.mark.parametrize("mode", sorted(MODES))
def test_helm_template_renders(mode: str) -> None:
    objs = render(MODES[mode])
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "ServiceAccount", "Service", "ConfigMap"} <= kinds
    for o in objs:
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpujob", o["kind"]


def deployment(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (d,) = find(objs, "Deployment")
    return d


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = deployment(objs)["spec"]["template"]["spec"]["containers"]
    return c


def env(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(objs)["env"]}


def test_default_deployment_is_hardened_and_single() -> None:
    objs = render()
    d = deployment(objs)
    pod = d["spec"]["template"]["spec"]
    c = container(objs)
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    assert c["command"] == ["gpujob"] and c["args"][0] == "operator"
    # The endpoints bind the pod IP: the probes and the Service reach it, and replicas that
    # share a network namespace (the local cluster's node agent) do not collide.
    assert "--liveness=http://$(POD_IP):8080/healthz" in c["args"]
    assert "--metrics-addr=$(POD_IP)" in c["args"] and "--metrics-port=8081" in c["args"]
    refs = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}) for e in c["env"]}
    assert refs["POD_IP"]["fieldPath"] == "status.podIP"
    assert refs["POD_ID"]["fieldPath"] == "metadata.name"  # kopf's peering identity
    assert not [a for a in c["args"] if a.startswith("--namespace")]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "health": 8080,
        "metrics": 8081,
        "webhook": 9443,
    }
    assert "GPUJOB_PEERING" not in env(objs)
    assert pod["serviceAccountName"] == "gj-gpujob"


def rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((g, res), set()).update(r["verbs"])
    return out


def assert_least_privilege(role: dict[str, Any]) -> None:
    got = rules(role)
    for (group, res), verbs in got.items():
        assert "*" not in verbs and res != "*" and group != "*", (group, res)
    assert not {res for _, res in got} & {
        "secrets",
        "pods/exec",
        "namespaces",
        "nodes",
    }
    assert got[("gpujob.dev", "gputrainingjobs/status")] == {"get", "patch"}
    # patch: an in-place restart moves a pod to the next attempt (labels, annotations).
    assert got[("", "pods")] == {"get", "list", "watch", "create", "delete", "patch"}
    assert got[("", "configmaps")] == {"create", "patch"}  # hang evidence: written, never read
    assert "update" not in got[("gpujob.dev", "gputrainingjobs")]


def operator_roles(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's own (cluster) roles or bindings: not the forecast's nor the users'
    aggregated ones, tested apart."""
    return [
        o
        for o in find(objs, kind)
        if not o["metadata"]["name"].endswith(("-forecast", "-edit", "-view"))
    ]


def test_cluster_mode_rbac() -> None:
    objs = render()
    (role,) = operator_roles(objs, "ClusterRole")
    (binding,) = operator_roles(objs, "ClusterRoleBinding")
    assert not find(objs, "Role") and not find(objs, "RoleBinding")
    assert_least_privilege(role)
    assert rules(role)[("apiextensions.k8s.io", "customresourcedefinitions")] == {"list", "watch"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gj-gpujob", "namespace": "gpujob-system"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_namespaced_mode_rbac_and_args() -> None:
    objs = render(MODES["namespaced"])
    roles = find(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in find(objs, "RoleBinding")) == [
        "team-a",
        "team-b",
    ]
    for r in roles:
        assert_least_privilege(r)
    (discovery,) = operator_roles(objs, "ClusterRole")
    assert rules(discovery) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
    }
    args = container(objs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    strict = render(
        {**MODES["namespaced"], "rbac": {**MODES["namespaced"]["rbac"], "clusterDiscovery": False}}
    )
    assert not operator_roles(strict, "ClusterRole")
    assert not operator_roles(strict, "ClusterRoleBinding")


def test_peering_cluster_mode() -> None:
    objs = render(MODES["peering-cluster"])
    d = deployment(objs)
    assert d["spec"]["replicas"] == 2 and d["spec"]["strategy"]["type"] == "RollingUpdate"
    assert (
        env(objs)["GPUJOB_PEERING"] == "gpujob" and env(objs)["GPUJOB_PEERING_CLUSTERWIDE"] == "1"
    )
    assert env(objs)["GPUJOB_PEERING_LIFETIME"] == "20"  # the takeover bound after a SIGKILL
    # kopf's CRDs ship in crds/ (installed first, never templated): none rendered here.
    assert not find(objs, "CustomResourceDefinition")
    (peering,) = find(objs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "gpujob"
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    (role,) = operator_roles(objs, "ClusterRole")
    assert rules(role)[("kopf.dev", "clusterkopfpeerings")] == {"get", "list", "watch", "patch"}


def test_peering_namespaced_mode() -> None:
    objs = render(MODES["peering-namespaced"])
    assert "GPUJOB_PEERING_CLUSTERWIDE" not in env(objs)
    assert sorted(p["metadata"]["namespace"] for p in find(objs, "KopfPeering")) == [
        "team-a",
        "team-b",
    ]
    for r in find(objs, "Role"):
        assert rules(r)[("kopf.dev", "kopfpeerings")] == {"get", "list", "watch", "patch"}


def test_monitoring_objects() -> None:
    objs = render(MODES["everything"])
    (sm,) = find(objs, "ServiceMonitor")
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "metrics" and ep["honorLabels"] is True
    assert {
        "action": "replace",
        "targetLabel": "job",
        "replacement": opfamilies.OPERATOR_JOB,
    } in ep["relabelings"]
    (svc,) = find(objs, "Service", "gj-gpujob-metrics")
    assert svc["spec"]["ports"][0]["name"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    (pm,) = find(objs, "PodMonitor")
    assert pm["spec"]["selector"] == {
        "matchExpressions": [{"key": "gpujob.dev/job-name", "operator": "Exists"}]
    }
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    (pep,) = pm["spec"]["podMetricsEndpoints"]
    assert "port" not in pep
    assert pep["relabelings"][0] == {
        "action": "keep",
        "sourceLabels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "metrics-[0-9]+",
    }
    (rule,) = find(objs, "PrometheusRule")
    assert rule["spec"] == {"groups": alerts.groups()["groups"]}
    assert find(render(MODES["monitoring"]), "PodMonitor")[0]["spec"]["namespaceSelector"] == {
        "any": True
    }


def test_dashboards_ship_as_sidecar_configmaps() -> None:
    objs = render()
    cms = {c["metadata"]["name"]: c for c in find(objs, "ConfigMap")}
    assert sorted(cms) == [
        "gj-gpujob-fleet-dashboard",
        "gj-gpujob-job-dashboard",
        "gj-gpujob-operator-dashboard",
    ]
    rendered = dashboards.render_all()
    for cm in cms.values():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads(rendered[key])
    assert not find(render({"dashboards": {"enabled": False}}), "ConfigMap")


def test_default_renders_no_prometheus_operator_objects() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "CustomResourceDefinition",
    }


def test_crds_ship_in_the_crds_folder() -> None:
    """Ours and kopf's peering CRDs: Helm creates them before the templates (a same-release
    peering object would otherwise race its CRD's discovery) and never deletes them."""
    res = template({}, "--include-crds")
    assert res.returncode == 0, res.stderr
    crds = [
        d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "CustomResourceDefinition"
    ]
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "clusterkopfpeerings.kopf.dev",
        "gputrainingjobs.gpujob.dev",
        "kopfpeerings.kopf.dev",
    ]


BAD_VALUES = [
    (
        {"rbac": {"mode": "clusterwide"}},
        "at '/rbac/mode': value must be one of 'cluster', 'namespaced'",
    ),
    ({"rbac": {"namespace": "x"}}, "at '/rbac': additional properties 'namespace' not allowed"),
    ({"operator": {"metricsPort": "abc"}}, "at '/operator/metricsPort': got string, want integer"),
    (
        {"operator": {"metricsPort": 70000}},
        "at '/operator/metricsPort': maximum: got 70,000, want 65,535",
    ),
    ({"replicas": 2}, "at '': additional properties 'replicas' not allowed"),
    (
        {"image": {"pullPolicy": "Sometimes"}},
        "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    (
        {"rbac": {"namespaces": ["Team_A"]}},
        "at '/rbac/namespaces/0': 'Team_A' does not match pattern",
    ),
    (
        {"metrics": {"podMonitor": {"interval": "15"}}},
        "at '/metrics/podMonitor/interval': '15' does not match pattern",
    ),
    (
        {"dashboards": {"labels": {"grafana_dashboard": 1}}},
        "at '/dashboards/labels/grafana_dashboard': got number, want string",
    ),
    (
        {"gang": {"default": "Volcano"}},
        "at '/gang/default': value must be one of 'None', 'Native', 'Kueue'",
    ),
    (
        {"gang": {"default": "Native"}},
        "gang.default=Native needs gang.native.enabled=true",
    ),
    (
        {"gang": {"default": "Kueue"}},
        "gang.default=Kueue needs gang.kueue.enabled=true",
    ),
    (
        {"rbac": {"mode": "namespaced"}},
        "rbac.mode=namespaced needs rbac.namespaces: the namespaces the operator may watch",
    ),
    (
        {"replicaCount": 2},
        "replicaCount > 1 needs peering.enabled=true: "
        "without kopf peering every replica would reconcile every job",
    ),
    (
        {"metrics": {"podMonitor": {"enabled": True}}},
        "metrics.podMonitor.enabled with jobEndpoints.networkPolicy.enabled needs "
        "jobEndpoints.networkPolicy.metricsFrom",
    ),
    (
        {"jobEndpoints": {"networkPolicy": {"metricsFrom": [{}]}}},
        "at '/jobEndpoints/networkPolicy/metricsFrom/0'",
    ),
    (
        {"webhook": {"networkPolicy": {"enabled": True}}},
        "webhook.networkPolicy.enabled needs webhook.networkPolicy.from",
    ),
    (
        {"jobEndpoints": {"token": {"enabled": "yes"}}},
        "at '/jobEndpoints/token/enabled'",
    ),
    (
        {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.service.enabled: "
        "the ServiceMonitor selects that Service",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"), BAD_VALUES, ids=[m.split(":")[0][:40] for _, m in BAD_VALUES]
)
def test_bad_values_are_refused_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    res = template(values)
    assert res.returncode != 0, f"accepted {values}"
    assert message in res.stderr, res.stderr


GANG = {"gang": {"native": {"enabled": True}, "kueue": {"enabled": True}}}


def test_gang_rbac_and_env_only_when_enabled() -> None:
    objs = render()
    (role,) = operator_roles(objs, "ClusterRole")
    groups = {g for g, _ in rules(role)}
    assert "scheduling.k8s.io" not in groups and "kueue.x-k8s.io" not in groups
    assert env(objs)["GPUJOB_DEFAULT_GANG"] == "None" and "GPUJOB_KUEUE" not in env(objs)

    objs = render({"gang": {**GANG["gang"], "default": "Native"}})
    (role,) = operator_roles(objs, "ClusterRole")
    assert_least_privilege(role)
    got = rules(role)
    assert got[("scheduling.k8s.io", "workloads")] == {"get", "create", "delete"}
    assert got[("scheduling.k8s.io", "podgroups")] == {"get", "create", "delete"}
    assert got[("kueue.x-k8s.io", "workloads")] == {"get", "list", "watch", "create", "delete"}
    assert got[("kueue.x-k8s.io", "workloads/status")] == {"patch"}
    assert got[("kueue.x-k8s.io", "resourceflavors")] == {"get"}
    assert got[("kueue.x-k8s.io", "workloadpriorityclasses")] == {"get"}
    assert env(objs)["GPUJOB_DEFAULT_GANG"] == "Native" and env(objs)["GPUJOB_KUEUE"] == "1"


def test_gang_rbac_in_namespaced_mode_reads_kueue_flavors_cluster_wide() -> None:
    objs = render({**MODES["namespaced"], **GANG})
    for role in find(objs, "Role"):
        assert ("kueue.x-k8s.io", "workloads/status") in rules(role)
        assert ("scheduling.k8s.io", "podgroups") in rules(role)
        assert ("kueue.x-k8s.io", "resourceflavors") not in rules(role)
    (kueue,) = [r for r in find(objs, "ClusterRole") if r["metadata"]["name"].endswith("-kueue")]
    assert rules(kueue) == {
        ("kueue.x-k8s.io", "resourceflavors"): {"get"},
        ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"},
    }


def forecast_role(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in find(objs, "ClusterRole") if r["metadata"]["name"].endswith("-forecast")]


def test_the_forecast_lists_gpu_holders_cluster_wide_in_cluster_mode() -> None:
    objs = render(GANG)
    (role,) = forecast_role(objs)
    assert rules(role) == {
        ("", "nodes"): {"list"},
        ("", "pods"): {"list"},
        ("kueue.x-k8s.io", "clusterqueues"): {"list"},
        ("kueue.x-k8s.io", "localqueues"): {"list"},
        ("kueue.x-k8s.io", "workloads"): {"list"},
    }
    (binding,) = [
        b for b in find(objs, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-forecast")
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert env(objs)["GPUJOB_FORECAST_INTERVAL"] == "30"
    off = render({"forecast": {"enabled": False}})
    assert not forecast_role(off) and env(off)["GPUJOB_FORECAST_INTERVAL"] == "0"


def test_a_namespaced_install_forecasts_only_when_granted_the_cluster_read() -> None:
    confined = render(MODES["namespaced"])
    assert not forecast_role(confined)
    assert env(confined)["GPUJOB_FORECAST_INTERVAL"] == "0"
    granted = render({**MODES["namespaced"], "forecast": {"clusterRead": True}})
    (role,) = forecast_role(granted)
    assert rules(role) == {("", "nodes"): {"list"}, ("", "pods"): {"list"}}
    assert env(granted)["GPUJOB_FORECAST_INTERVAL"] == "30"
    denied = render({"forecast": {"clusterRead": False}})
    assert not forecast_role(denied) and env(denied)["GPUJOB_FORECAST_INTERVAL"] == "0"


def test_the_admission_webhook_is_on_by_default_with_its_certificate_and_service() -> None:
    objs = render()
    (secret,) = find(objs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    (svc,) = find(objs, "Service", "gj-gpujob-webhook")
    assert svc["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    (config,) = find(objs, "ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["clientConfig"]["service"] == {
        "name": "gj-gpujob-webhook",
        "namespace": svc["metadata"]["namespace"],
        "path": "/validate-pods",
        "port": 443,
    }
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 10
    assert hook["matchConditions"][0]["expression"] == podreview.SPEC_CHANGED
    assert hook["rules"][0]["resources"] == ["gputrainingjobs"]
    assert "namespaceSelector" not in hook  # cluster mode: every namespace
    e = env(objs)
    assert e["GPUJOB_WEBHOOK_PORT"] == "9443" and e["GPUJOB_WEBHOOK_ADDR"] == "$(POD_IP)"
    assert e["GPUJOB_WEBHOOK_CERT"] == "/etc/gpujob/webhook/tls.crt"
    pod = deployment(objs)["spec"]["template"]["spec"]
    assert {"name": "webhook-tls", "secret": {"secretName": "gj-gpujob-webhook-tls"}} in pod[
        "volumes"
    ]
    mount = next(m for m in container(objs)["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount["readOnly"] is True


def test_the_webhook_is_scoped_to_the_watched_namespaces_and_may_fail_closed() -> None:
    objs = render({**NAMESPACED, "webhook": {"failurePolicy": "Fail"}})
    (hook,) = find(objs, "ValidatingWebhookConfiguration")[0]["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": NAMESPACED["rbac"]["namespaces"],
            }
        ]
    }


def test_the_webhook_can_be_turned_off() -> None:
    objs = render({"webhook": {"enabled": False}})
    assert not find(objs, "ValidatingWebhookConfiguration") and not find(objs, "Secret")
    assert not [k for k in env(objs) if k.startswith("GPUJOB_WEBHOOK")]
    assert "webhook" not in {p["name"] for p in container(objs)["ports"]}


def test_the_webhook_can_use_a_secret_of_its_own() -> None:
    """GitOps renders (no lookup) and cert-manager: no generated certificate, CA injected."""
    objs = render({"webhook": {"existingSecret": "gpujob-webhook-cert"}})
    assert not find(objs, "Secret")
    (config,) = find(objs, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from-secret"].endswith(
        "/gpujob-webhook-cert"
    )
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    pod = deployment(objs)["spec"]["template"]["spec"]
    assert {"name": "webhook-tls", "secret": {"secretName": "gpujob-webhook-cert"}} in pod[
        "volumes"
    ]
    given = render({"webhook": {"existingSecret": "mine", "caBundle": "Q0E="}})
    (config,) = find(given, "ValidatingWebhookConfiguration")
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    assert "annotations" not in config["metadata"]


def test_the_admission_policy_requires_the_author_may_create_pods() -> None:
    objs = render()
    (policy,) = find(objs, "ValidatingAdmissionPolicy")
    (binding,) = find(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert (
        binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    )
    assert policy["spec"]["failurePolicy"] == "Fail"  # a check that cannot run must not admit
    (rule,) = policy["spec"]["validations"]
    assert "resource('pods')" in rule["expression"] and "check('create')" in rule["expression"]
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == podreview.SPEC_CHANGED  # the operator's status writes pass
    scoped = render(NAMESPACED)
    (binding,) = find(scoped, "ValidatingAdmissionPolicyBinding")
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == NAMESPACED["rbac"]["namespaces"]
    assert not find(render({"admissionPolicy": {"enabled": False}}), "ValidatingAdmissionPolicy")


def test_jobs_are_aggregated_into_the_built_in_user_roles() -> None:
    roles = {
        label: r
        for r in find(render(), "ClusterRole")
        for label in r["metadata"]["labels"]
        if label.startswith("rbac.authorization.k8s.io/aggregate-to-")
    }
    assert set(roles) == {
        f"rbac.authorization.k8s.io/aggregate-to-{r}" for r in ("admin", "edit", "view")
    }
    view = roles["rbac.authorization.k8s.io/aggregate-to-view"]
    assert {v for rule in view["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    edit = roles["rbac.authorization.k8s.io/aggregate-to-edit"]
    (status,) = [r for r in edit["rules"] if "gputrainingjobs/status" in r["resources"]]
    assert set(status["verbs"]) == {"get", "list", "watch"}  # status is the operator's
    off = render({"rbac": {"aggregateToDefaultRoles": False}})
    assert not [r for r in find(off, "ClusterRole") if "aggregate" in str(r["metadata"]["labels"])]


def test_every_job_gets_a_network_policy_that_lets_the_operator_in_by_default() -> None:
    from gpujob_operator.runtime.settings import from_env

    objs = render()
    (role,) = operator_roles(objs, "ClusterRole")
    assert rules(role)[("networking.k8s.io", "networkpolicies")] == {"create"}
    assert ("", "secrets") not in rules(role)  # no token by default
    # What the chart sets is what the operator reads: its own pods, by namespace and labels.
    setting = from_env(env(objs)).job_network_policy
    assert setting is not None and not setting.other_ports_open  # closed unless opened
    (operator_peer,) = setting.metrics_from
    pod_labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert operator_peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpujob-system"}},
        "podSelector": {"matchLabels": deployment(objs)["spec"]["selector"]["matchLabels"]},
    }
    assert operator_peer["podSelector"]["matchLabels"].items() <= pod_labels.items()

    objs = render(MODES["monitoring"])
    setting = from_env(env(objs)).job_network_policy
    assert setting is not None and setting.metrics_from[1:] == (PROMETHEUS_PEER,)
    objs = render({"jobEndpoints": {"networkPolicy": {"enabled": False, "otherPortsOpen": False}}})
    assert "GPUJOB_JOB_NETWORK_POLICY" not in env(objs)
    assert ("networking.k8s.io", "networkpolicies") not in rules(
        operator_roles(objs, "ClusterRole")[0]
    )


@pytest.mark.parametrize("mode", ["default", "namespaced"])
def test_the_endpoint_token_key_is_a_secret_the_operator_reads_from_a_file(mode: str) -> None:
    from gpujob_operator.runtime.settings import ENV_TOKEN_KEY_FILE

    values = {**MODES[mode], "jobEndpoints": {"token": {"enabled": True}}}
    objs = render(values)
    (secret,) = find(objs, "Secret", "gj-gpujob-endpoint-token-key")
    assert len(secret["data"]["key"]) >= 64  # base64 of 64 random characters
    path = env(objs)[ENV_TOKEN_KEY_FILE]
    c = container(objs)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "endpoint-token-key"]
    (volume,) = [
        v
        for v in deployment(objs)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "endpoint-token-key"
    ]
    assert path == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    assert volume["secret"]["secretName"] == "gj-gpujob-endpoint-token-key"
    roles = operator_roles(objs, "ClusterRole" if mode == "default" else "Role")
    for role in roles:
        assert rules(role)[("", "secrets")] == {"create"}  # written, never read

    objs = render({"jobEndpoints": {"token": {"enabled": True, "existingSecret": "mine"}}})
    assert not find(objs, "Secret", "gj-gpujob-endpoint-token-key")
    (volume,) = [
        v
        for v in deployment(objs)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "endpoint-token-key"
    ]
    assert volume["secret"]["secretName"] == "mine"


def test_only_the_api_server_may_reach_the_webhook_port_when_its_policy_is_on() -> None:
    assert not [
        p for p in find(render(), "NetworkPolicy") if p["metadata"]["name"].endswith("-webhook")
    ]
    apiserver = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    objs = render({"webhook": {"networkPolicy": {"enabled": True, "from": apiserver}}})
    (policy,) = [
        p for p in find(objs, "NetworkPolicy") if p["metadata"]["name"].endswith("-webhook")
    ]
    pod_labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    webhook_rule, others = policy["spec"]["ingress"]
    assert webhook_rule == {"from": apiserver, "ports": [{"protocol": "TCP", "port": 9443}]}
    assert "from" not in others  # every other port, from anywhere: health, metrics
    tcp = [(p["port"], p["endPort"]) for p in others["ports"] if p["protocol"] == "TCP"]
    assert tcp == [(1, 9442), (9444, 65535)]


def test_the_webhook_can_require_the_api_servers_client_certificate() -> None:
    assert "GPUJOB_WEBHOOK_CLIENT_CA" not in env(render())
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    objs = render({"webhook": {"clientCA": pem}})
    (cm,) = [c for c in find(objs, "ConfigMap") if c["metadata"]["name"].endswith("-client-ca")]
    assert cm["data"]["ca.crt"] == pem
    path = env(objs)["GPUJOB_WEBHOOK_CLIENT_CA"]
    mounts = {m["name"]: m["mountPath"] for m in container(objs)["volumeMounts"]}
    assert path == mounts["webhook-client-ca"] + "/ca.crt"
    volumes = {v["name"]: v for v in deployment(objs)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-client-ca"]["configMap"]["name"] == cm["metadata"]["name"]
