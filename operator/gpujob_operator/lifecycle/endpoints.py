"""Who can reach a job's endpoints: its NetworkPolicy and its endpoint token (pure).

Each rank's metrics port serves ``/metrics`` and ``/debug/evidence`` (every thread's stacks,
the Flight Recorder). Open to the whole cluster, another tenant could read a job's stacks and
spend its ranks' CPU. Two means close it, each an operator setting (the chart's
``jobEndpoints`` values):

* A NetworkPolicy per job (``<job>-endpoints-<uid8>``, owned by the job): only the operator and the
  peers the chart names (Prometheus) reach the metrics ports. Where the cluster's network
  plugin enforces NetworkPolicy, this closes both paths.
* A token per job, for clusters that do not enforce NetworkPolicy (or ranks on the host
  network, which most plugins do not police): HMAC(operator key, job UID), so the operator
  recomputes it for every request and never reads a Secret back; the pods get it from a Secret
  ``<job>-endpoint-token-<uid8>`` owned by the job. The trainer then answers ``/debug/*`` only to a
  request carrying it; ``/metrics`` stays open (Prometheus has no per-job token).

The I/O shell (``runtime/jobloop.py``) creates both before the job's pods.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api.children import (
    LABEL_MANAGED_BY,
    MANAGED_BY,
    job_meta,
    owner_reference,
    selector_labels,
)
from gpujob_operator.lifecycle.builders import CONTAINER_NAME, job_ports
from gpujob_trainer.contract import ENV_ENDPOINT_TOKEN

TOKEN_KEY: Final = "token"
"""The key of the token in the job's Secret."""
MAX_PORT: Final = 65535


@dataclass(frozen=True)
class PolicySettings:
    """What the job's NetworkPolicy lets in (the operator's ``GPUJOB_JOB_NETWORK_POLICY``)."""

    metrics_from: tuple[Mapping[str, Any], ...]
    """NetworkPolicyPeers that may reach the metrics ports: the operator's pods (the chart
    puts them first) and the Prometheus that scrapes the PodMonitor."""
    other_ports_open: bool = False
    """Every other port stays reachable from anywhere, as without the policy. False (the
    default): only the job's own pods reach them; policies add up, so an allow here would
    reopen what a namespace's default-deny policy closes, for any pod with the job's label."""


def network_policy_name(job: Mapping[str, Any]) -> str:
    """``<job>-endpoints-<uid8>``: the job's UID in the name, so a job re-created under the
    same name before the old one's children are collected never keeps (and then loses to
    the garbage collector) the old one's policy, and nobody's object of the plain name is
    taken for the job's."""
    return f"{job_meta(job)[0]}-endpoints{_uid_suffix(job)}"


def token_secret_name(job: Mapping[str, Any]) -> str:
    """``<job>-endpoint-token-<uid8>``: a new job of the same name reads its own token
    (derived from its UID), never the old job's, nor a Secret a user named so."""
    return f"{job_meta(job)[0]}-endpoint-token{_uid_suffix(job)}"


def _uid_suffix(job: Mapping[str, Any]) -> str:
    uid = job_meta(job)[2]
    return f"-{uid[:8]}" if uid else ""


def _metrics_range(first: int, last: int) -> dict[str, Any]:
    port: dict[str, Any] = {"protocol": "TCP", "port": first}
    if last > first:
        port["endPort"] = last
    return port


def build_network_policy(
    job: Mapping[str, Any], settings: PolicySettings, spec: api.GPUTrainingJobSpec | None = None
) -> dict[str, Any]:
    """The job's ingress policy: its metrics ports for ``metrics_from`` only.

    Once a pod is selected by a policy for Ingress, whatever no rule allows is denied. So the
    policy must allow, besides the metrics ports:

    * everything from the job's own pods, on every port and protocol: the rendezvous, NCCL
      and gloo open ports of their own choosing between ranks;
    * (``other_ports_open``) everything from anywhere except the metrics ports, which a
      NetworkPolicy cannot say directly ("all but N"): it allows TCP on the ranges below and
      above the metrics block (``port`` .. ``endPort``), and UDP and SCTP on every port.

    A rule with no ``from`` admits every source, so with no ``metrics_from`` peer the
    metrics rule is left out rather than written empty.
    """
    spec = spec if spec is not None else api.parse_spec(job["spec"])
    name = job_meta(job)[0]
    first = job_ports(job, spec).metrics
    last = first + spec.procs_per_node - 1
    rules: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": selector_labels(name)}}]}
    ]
    if settings.metrics_from:
        rules.append(
            {
                "from": [copy.deepcopy(dict(p)) for p in settings.metrics_from],
                "ports": [_metrics_range(first, last)],
            }
        )
    if settings.other_ports_open:
        ports = [
            _metrics_range(lo, hi) for lo, hi in ((1, first - 1), (last + 1, MAX_PORT)) if lo <= hi
        ]
        ports += [{"protocol": "UDP"}, {"protocol": "SCTP"}]
        rules.append({"ports": ports})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _guard_metadata(job, network_policy_name(job)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def endpoint_token(key: bytes, job: Mapping[str, Any]) -> str:
    """The job's token: derived from its UID, so no Secret is ever read back (and the operator
    needs no permission to read Secrets); a new job of the same name gets another."""
    name, namespace, uid = job_meta(job)
    message = b"gpujob endpoint token\0" + (uid or f"{namespace}/{name}").encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def build_token_secret(job: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The Secret the job's pods read their token from, owned by the job."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _guard_metadata(job, token_secret_name(job)),
        "stringData": {TOKEN_KEY: token},
    }


def _guard_metadata(job: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A guard's metadata: in the job's namespace, with its labels, owned by it."""
    job_name, namespace, _ = job_meta(job)
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**selector_labels(job_name), LABEL_MANAGED_BY: MANAGED_BY},
        "ownerReferences": [owner_reference(job)],
    }


def with_token_env(
    pods: Sequence[Mapping[str, Any]], job: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The same pods, their trainer container reading ``GPUJOB_ENDPOINT_TOKEN`` from the
    job's Secret (not optional: a pod must not start with its evidence open)."""
    ref = {"name": token_secret_name(job), "key": TOKEN_KEY}
    token_env = {"name": ENV_ENDPOINT_TOKEN, "valueFrom": {"secretKeyRef": ref}}

    def guarded(container: Mapping[str, Any]) -> dict[str, Any]:
        if container.get("name") != CONTAINER_NAME:
            return dict(container)
        env = [e for e in container.get("env") or () if e.get("name") != ENV_ENDPOINT_TOKEN]
        return {**container, "env": [*env, copy.deepcopy(token_env)]}

    # Only the path to the trainer's env is copied: a pod's template may be large, and the
    # pods as built are not changed.
    return [
        {
            **pod,
            "spec": {**pod["spec"], "containers": [guarded(k) for k in pod["spec"]["containers"]]},
        }
        for pod in pods
    ]
