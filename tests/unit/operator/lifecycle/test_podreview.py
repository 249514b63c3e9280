"""The admission webhook's pure decisions: the dry-run pods and what a refusal means."""

from __future__ import annotations

from typing import Any

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle.apiserver import podreview
from gpujob_operator.lifecycle.apiserver.refusals import Refusal, classify

SPEC: dict[str, Any] = {
    "image": "img:1",
    "command": ["python", "-m", "train"],
    "nodes": 3,
    "env": [{"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a b']"}}}],
    "template": {
        "volumes": [{"name": "creds", "secret": {"secretName": "s", "defaultMode": 4096}}]
    },
}
JOB: dict[str, Any] = {"metadata": {"name": "j" * 250, "namespace": "ns"}, "spec": SPEC}


def pods() -> list[dict[str, Any]]:
    return podreview.review_pods(JOB, api.parse_spec(SPEC))


def invalid(*causes: tuple[str, str]) -> tuple[Refusal, dict[str, Any]]:
    status = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": 'Pod "x" is invalid: ...',
        "details": {"causes": [{"field": f, "message": m} for f, m in causes]},
    }
    return classify(422, status), status


def test_rank_zero_and_the_last_rank_without_owner_under_a_name_of_their_own() -> None:
    built = pods()
    ranks = [p["metadata"]["labels"]["gpujob.dev/node-rank"] for p in built]
    assert ranks == ["0", "2"]
    for p in built:
        name = p["metadata"]["name"]
        assert name.endswith(podreview.DRY_RUN_SUFFIX) and len(name) <= 253
        assert "ownerReferences" not in p["metadata"]
        assert p["metadata"]["namespace"] == "ns"
        assert p["spec"]["hostname"] != name  # the real pod's hostname, kept


def test_a_single_node_job_dry_runs_one_pod() -> None:
    assert len(podreview.review_pods(JOB, api.parse_spec({**SPEC, "nodes": 1}))) == 1


def test_invalid_pod_is_refused_with_the_users_paths() -> None:
    pod = pods()[0]
    k = [e["name"] for e in pod["spec"]["containers"][0]["env"]].index("TEAM")
    refusal, status = invalid(
        (f"spec.containers[0].env[{k}].valueFrom.fieldRef", 'Invalid value: "a b": name part'),
        ("spec.volumes[0].secret.defaultMode", "Invalid value: 4096: must be a number"),
        ("spec.hostname", "Invalid value: too long"),
    )
    v = podreview.judge(refusal, status, SPEC, pod)
    assert not v.allowed and v.code == 422
    lines = v.message.split("\n")
    assert lines[1:] == [
        'spec.env[0].valueFrom.fieldRef: Invalid value: "a b": name part',
        "spec.template.volumes[0].secret.defaultMode: Invalid value: 4096: must be a number",
        "spec.hostname (set by the operator): Invalid value: too long",
    ]


def test_strict_decoding_names_the_users_field() -> None:
    pod = pods()[0]
    message = (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.volumes[0].secret.defaultMod"'
    )
    status = {"kind": "Status", "code": 400, "reason": "BadRequest", "message": message}
    v = podreview.judge(classify(400, status), status, SPEC, pod)
    assert not v.allowed and v.code == 400
    assert 'unknown field "spec.template.volumes[0].secret.defaultMod"' in v.message


def test_an_undecodable_quantity_is_refused_naming_the_users_field() -> None:
    spec = {
        **SPEC,
        "template": {
            "volumes": [
                {"name": "creds", "secret": {"secretName": "s"}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "lots"}},
            ],
            "resources": {"limits": {"example.com/nic": "1x"}},
        },
    }
    pod = podreview.review_pods(JOB, api.parse_spec(spec))[0]
    message = (
        'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular '
        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    status = {"kind": "Status", "code": 400, "reason": "BadRequest", "message": message}
    v = podreview.judge(classify(400, status), status, spec, pod)
    assert not v.allowed and v.code == 400
    assert v.message.split("\n")[1:] == [
        'spec.template.volumes[1].emptyDir.sizeLimit: "lots" is not a quantity (e.g. 500Mi, 2, 1.5)',
        'spec.template.resources.limits[example.com/nic]: "1x" is not a quantity (e.g. 500Mi, 2, 1.5)',
    ]


def test_pod_security_is_refused() -> None:
    message = (
        'pods "x" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "trainer" must set ...)'
    )
    status = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": message}
    v = podreview.judge(classify(403, status), status, SPEC, pods()[0])
    assert not v.allowed and v.code == 403 and "violates PodSecurity" in v.message


def test_run_time_states_are_admitted_with_a_warning() -> None:
    cases = [
        (
            403,
            'pods "x" is forbidden: error looking up service account ns/sa: serviceaccount "sa" not found',
        ),
        (
            403,
            'pods "x" is forbidden: exceeded quota: q, requested: cpu=2, used: cpu=9, limited: cpu=10',
        ),
        (409, 'pods "x" already exists'),
        (500, "etcdserver: request timed out"),
        (400, "the server rejected our request for an unknown reason"),
    ]
    for code, message in cases:
        status = {"kind": "Status", "code": code, "message": message}
        v = podreview.judge(classify(code, status), status, SPEC, pods()[0])
        assert v.allowed, message
        assert len(v.warnings) == 1 and message.split(":")[0] in v.warnings[0]
    unreachable = Refusal(c.API_UNREACHABLE, False, "no answer to the dry run in 5s")
    v = podreview.judge(unreachable, {}, SPEC, pods()[0])
    assert v.allowed and "no answer" in v.warnings[0]


def test_merge_keeps_the_first_refusal_and_every_distinct_cause() -> None:
    a = podreview.Verdict(False, "head\nx: 1\ny: 2", 422)
    b = podreview.Verdict(False, "head\ny: 2\nz: 3", 422)
    w = podreview.Verdict(True, warnings=("w",))
    assert podreview.merge([w, a, b]).message == "head\nx: 1\ny: 2\nz: 3"
    assert podreview.merge([w, w, podreview.ALLOW]) == podreview.Verdict(True, warnings=("w",))


def test_the_webhook_configuration() -> None:
    body = podreview.webhook_configuration(
        "gpujob-test",
        {"url": "https://127.0.0.1:9443/validate-pods", "caBundle": "Q0E="},
        ["b", "a"],
    )
    (hook,) = body["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == podreview.WEBHOOK_TIMEOUT_SECONDS
    assert podreview.DRY_RUN_TIMEOUT < podreview.WEBHOOK_TIMEOUT_SECONDS
    assert hook["rules"][0]["resources"] == [api.PLURAL]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert hook["matchConditions"][0]["expression"] == podreview.SPEC_CHANGED
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["a", "b"]
    everywhere = podreview.webhook_configuration("g", {"url": "u"})
    assert "namespaceSelector" not in everywhere["webhooks"][0]
    # kopf's --namespace globs cannot be a selector: the webhook then reviews everywhere.
    globbed = podreview.webhook_configuration("g", {"url": "u"}, ["team-*", "ml"])
    assert "namespaceSelector" not in globbed["webhooks"][0]
