"""The admission webhook's decisions (pure): which pods to dry-run, what a refusal means.

The CRD's schema and CEL rules check the job's own fields; only core/v1 itself knows every
rule of a pod (a label key inside an env ``fieldRef``, a volume source's required fields, a
file mode). So the webhook builds the job's pods with the same builder the operator uses
and asks the API server to create them with ``dryRun=All&fieldValidation=Strict``.

What the answer means is decided here, from the refusal as :mod:`refusals` classifies it:

* the pod as built can never be created (core/v1 refuses a field, strict decoding finds an
  unknown field, PodSecurity refuses it): the job is refused, one line per cause, each
  cause's field mapped back to the user's field (:mod:`podpaths`);
* anything else (a missing ServiceAccount, a full quota, a conflict, a timeout, no answer):
  a state of the cluster at this moment, not a mistake in the spec; the job is admitted with
  a warning, and the operator's run-time handling applies as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.quantity import parse_quantity
from gpujob_operator.lifecycle.apiserver import podpaths, refusals
from gpujob_operator.lifecycle.builders import build_pod

DRY_RUN_SUFFIX: Final = "-admission"
"""Appended to a dry-run pod's name: it never collides with the job's live pods (a dry-run
create of an existing name is refused 409)."""
NAME_MAX: Final = 253
DRY_RUN_TIMEOUT: Final = 5.0
"""Seconds the dry-run may take: below :data:`WEBHOOK_TIMEOUT_SECONDS`, so a slow API
server yields a warning from the webhook, never the API server's own webhook timeout."""
WEBHOOK_TIMEOUT_SECONDS: Final = 10
WEBHOOK_PATH: Final = "validate-pods"
"""The webhook's URL path (kopf routes ``/<handler id>``); the chart's Service uses it too."""
SPEC_CHANGED: Final = "request.operation == 'CREATE' || object.spec != oldObject.spec"
"""The webhook's matchCondition: an update that leaves the spec alone (status, labels,
annotations, finalizers) is not sent to the webhook at all."""
_REFUSED: Final = frozenset({c.INVALID_POD_TEMPLATE, c.POD_SECURITY_VIOLATION})
_STRICT: Final = refusals.STRICT_DECODING
_QUANTITY_PARENTS: Final = frozenset({"limits", "requests", "overhead"})
"""Maps whose values core/v1 decodes as quantities (container, pod, claim resources; the
pod's overhead); with ``sizeLimit`` (emptyDir), every quantity a pod template can hold."""
_FIELD_IN_MESSAGE: Final = re.compile(r'(unknown field|duplicate field) "([^"]+)"')
T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer about one job."""

    allowed: bool
    message: str = ""
    """Why not (one line per cause), when not allowed."""
    code: int = 422
    warnings: tuple[str, ...] = ()
    """Shown by kubectl on an admitted job: the pods could not be checked now."""


ALLOW: Final = Verdict(True)


def dry_run_name(pod_name: str) -> str:
    """The dry-run pod's name: the real pod's with :data:`DRY_RUN_SUFFIX`, within 253."""
    return pod_name[: NAME_MAX - len(DRY_RUN_SUFFIX)] + DRY_RUN_SUFFIX


def representatives(ranks: Sequence[T]) -> list[T]:
    """The ranks (or rank-ordered pods) whose dry runs stand for all of them: the first,
    and the last when there are several.

    Every pod of a job comes from one builder and one template; ranks differ only in their
    rank-derived values (env, command flags, hostname, ports), and the first and last hold
    the extremes of each. Dry-running every pod of a 2,048-pod gang doubled the requests a
    create or a restart makes, at 400 KB a pod; a refusal the sample missed still stops the
    create at that pod, and the planner releases the partial gang after its grace.
    """
    return list(ranks[:1]) if len(ranks) <= 1 else [ranks[0], ranks[-1]]


def review_pods(job: Mapping[str, Any], spec: api.GPUTrainingJobSpec) -> list[dict[str, Any]]:
    """The pods to dry-run for ``job``: those of :func:`representatives`.

    Built as the operator builds them, less the owner reference (the job may not exist yet)
    and under a name of their own; hostname, namespace and everything else stay.
    """
    meta = dict(job.get("metadata") or {})
    meta.setdefault("uid", "00000000-0000-0000-0000-000000000000")  # owner ref, stripped below
    whole = {**job, "metadata": meta}
    ranks = representatives(range(spec.nodes))
    pods = []
    for rank in ranks:
        pod = build_pod(whole, rank, 0, spec)
        pod["metadata"].pop("ownerReferences", None)
        pod["metadata"]["name"] = dry_run_name(pod["metadata"]["name"])
        pods.append(pod)
    return pods


def judge(
    refusal: refusals.Refusal,
    status: Mapping[str, Any],
    spec: Mapping[str, Any],
    pod: Mapping[str, Any],
) -> Verdict:
    """What the API server's refusal of dry-run ``pod`` (built from the raw ``spec``) means
    for the job: refuse it with the user's field paths, or admit it with a warning."""
    message = str(status.get("message") or refusal.message)
    strict = refusal.code == 400 and refusals.undecodable(message)
    if refusal.reason not in _REFUSED and not strict:
        return Verdict(
            True,
            warnings=(
                f"the job's pods could not be checked against the API server now "
                f"({refusal.reason}: {refusal.message}); they are checked again when created",
            ),
        )
    lines = (
        cause_lines(status, spec, pod)
        or bad_quantity_lines(message, spec, pod)
        or [_mapped_message(message, spec, pod)]
    )
    why = "PodSecurity" if refusal.reason == c.POD_SECURITY_VIOLATION else "core/v1"
    return Verdict(
        False,
        f"the job's pods would be refused ({why}):\n" + "\n".join(lines),
        refusal.code or 422,
    )


def cause_lines(
    status: Mapping[str, Any], spec: Mapping[str, Any], pod: Mapping[str, Any]
) -> list[str]:
    """``<user path>: <message>`` for each cause of a Status (``details.causes``)."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    lines: list[str] = []
    for cause in causes if isinstance(causes, list) else ():
        if not isinstance(cause, Mapping):
            continue
        text = str(cause.get("message") or cause.get("reason") or "")
        field = cause.get("field")
        if isinstance(field, str) and field:
            if _STRICT in text or _FIELD_IN_MESSAGE.search(text):
                lines.append(_mapped_message(text, spec, pod))
            else:
                lines.append(f"{podpaths.user_path(field, spec, pod)}: {text}")
        elif text:
            lines.append(_mapped_message(text, spec, pod))
    return lines


def bad_quantity_lines(message: str, spec: Mapping[str, Any], pod: Mapping[str, Any]) -> list[str]:
    """For a pod the server could not decode because of a quantity (its message names no
    field), ``<user path>: <value> is not a quantity`` for each quantity of the pod that
    core/v1 would not parse; empty when the message is about something else."""
    if "quantities must" not in message and "quantity" not in message.lower():
        return []
    lines: list[str] = []
    for path, value in _quantities(pod, ""):
        if parse_quantity(value) is None:
            where = podpaths.user_path(path.lstrip("."), spec, pod)
            lines.append(
                f"{where}: {json.dumps(value)[:64]} is not a quantity (e.g. 500Mi, 2, 1.5)"
            )
    return lines


def _quantities(node: Any, path: str, parent: str = "") -> list[tuple[str, Any]]:
    """(pod path, value) of every quantity-valued field under ``node``."""
    out: list[tuple[str, Any]] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            keyed = parent in _QUANTITY_PARENTS  # a resource name may hold dots
            here = f"{path}[{key}]" if keyed else f"{path}.{key}"
            if (key == "sizeLimit" or keyed) and not isinstance(value, Mapping | list):
                out.append((here, value))
                continue
            out += _quantities(value, here, str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += _quantities(item, f"{path}[{i}]")
    return out


def _mapped_message(message: str, spec: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    """A message naming pod fields in quotes (strict decoding), with the user's paths."""

    def swap(m: re.Match[str]) -> str:
        return f'{m[1]} "{podpaths.user_path(m[2], spec, pod)}"'

    return _FIELD_IN_MESSAGE.sub(swap, " ".join(message.split()))


def merge(verdicts: Sequence[Verdict]) -> Verdict:
    """One answer for several dry-run pods: the first refusal, with every distinct cause;
    else admitted, with every distinct warning."""
    refused = [v for v in verdicts if not v.allowed]
    if refused:
        head, *_ = refused[0].message.split("\n", 1)
        lines: list[str] = []
        for v in refused:
            for line in v.message.split("\n")[1:]:
                if line not in lines:
                    lines.append(line)
        return Verdict(False, "\n".join([head, *lines]), refused[0].code)
    warnings: list[str] = []
    for v in verdicts:
        warnings += [w for w in v.warnings if w not in warnings]
    return Verdict(True, warnings=tuple(warnings))


def webhook_configuration(
    name: str,
    client_config: Mapping[str, Any],
    namespaces: Sequence[str] = (),
    failure_policy: str = "Ignore",
) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration that sends the jobs' creates and spec updates to
    the webhook at ``client_config`` (a ``url`` or a ``service``, and its ``caBundle``).

    ``namespaces`` scopes it to the namespaces an operator watches (empty: all). Side-effect
    free: the webhook only dry-runs. ``failure_policy`` Ignore: with the operator down, jobs
    are still admitted on the CRD's own checks, and their pods' problems surface at run time.
    """
    webhook: dict[str, Any] = {
        "name": f"{WEBHOOK_PATH}.{api.GROUP}",
        "admissionReviewVersions": ["v1"],
        "clientConfig": dict(client_config),
        "rules": [
            {
                "apiGroups": [api.GROUP],
                "apiVersions": [api.VERSION],
                "resources": [api.PLURAL],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
        ],
        "matchConditions": [{"name": "spec-changed", "expression": SPEC_CHANGED}],
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
    }
    if namespaces and not any(set(ns) & set("*?[") for ns in namespaces):
        # kopf's --namespace takes globs (team-*), which a selector cannot say: with one of
        # those the webhook reviews every namespace (it only validates, so that is safe).
        webhook["namespaceSelector"] = {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": sorted(set(namespaces)),
                }
            ]
        }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpujob-operator"}},
        "webhooks": [webhook],
    }
