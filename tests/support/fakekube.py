"""One stand-in for the operator's Kube client (``gpujob_operator.runtime.kube.Kube``).

The job loop and the admission webhook's reviewer take their Kube as an argument; unit
tests hand them a :class:`FakeKube` instead of an API server. Its methods are Kube's, with
Kube's signatures and return values, and by default it tells the truth about one
namespace's worth of objects:

- pods: a create stores the pod (with a uid of its own) unless one of that name exists
  (False, the 409); a delete takes it away (False when there was none, the 404); a listing
  returns the uids of the pods that exist now and match the label selector;
- the job: its status is written as a JSON merge patch (RFC 7386, :func:`apply_merge_patch`)
  and each write returns the job as stored, with a new resourceVersion; without a job, a
  status write is the 404 (None);
- gang objects (Workload, PodGroup, ...): created, read, status-patched and deleted;
- dry runs (``create_pod(dry_run=True)``, ``dry_run_pod``) persist nothing.

Scripted per test:

- ``refuse``: a method's name -> what that method raises, every time (a 403 of a full quota
  on ``create_pod``, dry runs included; a 403 on ``create_object``; a 422, a timeout or a
  refused connection on ``dry_run_pod``): :func:`api_error` builds the client's exception;
- ``answer_after``: the seconds each dry run takes to answer (a slow API server).

What the API server was asked is recorded: ``calls`` names each pod and object request in
order (``"create bert-node-0"``, ``"dry-run bert-node-0"``, ``"delete bert-node-1"``,
``"list"``, ``"create-object bert"``, ...), refused ones included; ``dry_runs`` keeps each
dry run's namespace, pod and time bound (None: unbounded).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from gpujob_operator.api.children import controller_uid
from gpujob_operator.runtime.kube import NameTaken


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, to check minimal_patch against."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


def api_error(
    code: int, reason: str, message: str, causes: list[dict[str, str]] | None = None
) -> ApiException:
    """What the Kubernetes client raises for a refusal: the HTTP status and its phrase, the
    server's metav1.Status (``reason``, ``message``, ``details.causes``) as the body."""
    status: dict[str, Any] = {"kind": "Status", "code": code, "reason": reason, "message": message}
    if causes is not None:
        status["details"] = {"causes": causes}
    e = ApiException(status=code, reason=HTTPStatus(code).phrase)
    e.body = json.dumps(status)
    return e


class Ref(Protocol):
    """How the client addresses a custom object (``gpujob_operator.lifecycle.gang.ObjectRef``)."""

    @property
    def group(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def name(self) -> str: ...


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _key_of(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """A custom object's (group, plural, name), the plural made from the kind as the API
    server's default (``PodGroup`` -> ``podgroups``, ``WorkloadPriorityClass`` ->
    ``workloadpriorityclasses``)."""
    kind = str(obj["kind"]).lower()
    plural = kind + "es" if kind.endswith(("s", "x", "z", "ch", "sh")) else kind + "s"
    return str(obj["apiVersion"]).rpartition("/")[0], plural, _name(obj)


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    """An equality-based label selector (``a=b,c=d``; empty: everything)."""
    wanted = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k) == v for k, v in wanted)


class FakeKube:
    """The API server's side, in memory: see the module's docstring."""

    def __init__(
        self,
        job: Mapping[str, Any] | None = None,
        pods: Iterable[Mapping[str, Any]] = (),
        *,
        refuse: Mapping[str, BaseException] | None = None,
        answer_after: float = 0.0,
    ) -> None:
        self.job: dict[str, Any] | None = copy.deepcopy(dict(job)) if job is not None else None
        self.status: dict[str, Any] = copy.deepcopy(dict((job or {}).get("status") or {}))
        self.resource_version = int((job or {}).get("metadata", {}).get("resourceVersion", 1))
        self.pods: dict[str, dict[str, Any]] = {_name(p): copy.deepcopy(dict(p)) for p in pods}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        """Namespaced custom objects by (group, plural, name)."""
        self.cluster_objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        """Cluster-scoped ones (a Kueue ResourceFlavor), put here by the test."""
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.created: dict[tuple[str, str], dict[str, Any]] = {}
        """The job's NetworkPolicy and Secret by (kind, name), as created."""
        self.services: set[str] | None = None
        """The Services that exist by name; None: every one asked about does."""
        self.served = True
        """Whether discovery lists every custom resource asked about."""
        self.refuse: dict[str, BaseException] = dict(refuse or {})
        self.answer_after = answer_after
        self.calls: list[str] = []
        self.dry_runs: list[tuple[str, dict[str, Any], float | None]] = []

    def names(self, *verbs: str) -> list[str]:
        """The names in ``calls`` of the given verbs (``names("create", "dry-run")``)."""
        return [name for verb, _, name in (c.partition(" ") for c in self.calls) if verb in verbs]

    def _refused(self, method: str) -> None:
        if method in self.refuse:
            raise self.refuse[method]

    # -- pods ---------------------------------------------------------------------------------
    async def create_pod(self, namespace: str, body: dict[str, Any], dry_run: bool = False) -> bool:
        name = _name(body)
        if dry_run:
            self.calls.append(f"dry-run {name}")
            self.dry_runs.append((namespace, copy.deepcopy(body), None))
            await asyncio.sleep(self.answer_after)
            self._refused("create_pod")
            return True
        self.calls.append(f"create {name}")
        self._refused("create_pod")
        if name in self.pods:
            return False
        pod = copy.deepcopy(body)
        pod["metadata"]["uid"] = f"new-{name}"
        self.pods[name] = pod
        return True

    async def dry_run_pod(
        self, namespace: str, body: dict[str, Any], timeout: float, executor: Any = None
    ) -> None:
        self.calls.append(f"dry-run {_name(body)}")
        self.dry_runs.append((namespace, copy.deepcopy(body), timeout))
        await asyncio.sleep(self.answer_after)
        self._refused("dry_run_pod")

    async def delete_pod(self, namespace: str, name: str) -> bool:
        self.calls.append(f"delete {name}")
        self._refused("delete_pod")
        return self.pods.pop(name, None) is not None

    async def pod_uids(self, namespace: str, selector: str) -> set[str]:
        self.calls.append("list")
        self._refused("pod_uids")
        return {
            p["metadata"]["uid"]
            for p in self.pods.values()
            if _matches(p["metadata"].get("labels") or {}, selector)
        }

    # -- the Service, the job, ConfigMaps -----------------------------------------------------
    async def create_service(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(f"create-service {_name(body)}")
        self._refused("create_service")
        if self.services is not None:
            self.services.add(_name(body))

    async def create_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(f"create-networkpolicy {_name(body)}")
        self._refused("create_network_policy")
        self.created.setdefault(("NetworkPolicy", _name(body)), copy.deepcopy(body))

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(f"create-secret {_name(body)}")
        self._refused("create_secret")
        self.created.setdefault(("Secret", _name(body)), copy.deepcopy(body))

    async def service_exists(self, namespace: str, name: str) -> bool:
        self._refused("service_exists")
        return self.services is None or name in self.services

    def _stored_job(self) -> dict[str, Any]:
        assert self.job is not None
        job = copy.deepcopy(self.job)
        job["metadata"]["resourceVersion"] = str(self.resource_version)
        job["status"] = copy.deepcopy(self.status)
        return job

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._refused("get_job")
        return None if self.job is None else self._stored_job()

    async def patch_status(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        self._refused("patch_status")
        if self.job is None:
            return None
        self.status = apply_merge_patch(self.status, copy.deepcopy(patch))
        self.resource_version += 1
        return self._stored_job()

    async def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(f"delete-job {name}")
        self._refused("delete_job")
        self.job = None

    async def put_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(f"put-configmap {_name(body)}")
        self._refused("put_configmap")
        held = self.configmaps.get(_name(body))
        first_owner = ((held or {}).get("metadata", {}).get("ownerReferences") or [{}])[0]
        if held is not None and first_owner.get("uid") != controller_uid(body):
            raise NameTaken("ConfigMap", _name(body))  # as the real one
        self.configmaps[_name(body)] = copy.deepcopy(body)

    # -- gang admission objects ---------------------------------------------------------------
    async def create_object(self, namespace: str, body: dict[str, Any]) -> bool:
        self.calls.append(f"create-object {_name(body)}")
        self._refused("create_object")
        key = _key_of(body)
        if key in self.objects:
            return False
        self.objects[key] = copy.deepcopy(body)
        return True

    async def delete_object(self, namespace: str, ref: Ref) -> None:
        self.calls.append(f"delete-object {ref.name}")
        self._refused("delete_object")
        self.objects.pop((ref.group, ref.plural, ref.name), None)

    async def get_object(self, namespace: str, ref: Ref) -> dict[str, Any] | None:
        self._refused("get_object")
        return copy.deepcopy(self.objects.get((ref.group, ref.plural, ref.name)))

    async def get_cluster_object(self, ref: Ref) -> dict[str, Any] | None:
        self._refused("get_cluster_object")
        return copy.deepcopy(self.cluster_objects.get((ref.group, ref.plural, ref.name)))

    async def patch_object_status(self, namespace: str, ref: Ref, patch: dict[str, Any]) -> bool:
        self.calls.append(f"patch-object-status {ref.name}")
        self._refused("patch_object_status")
        key = (ref.group, ref.plural, ref.name)
        if key not in self.objects:
            return False
        self.objects[key] = apply_merge_patch(self.objects[key], copy.deepcopy(patch))
        return True

    async def serves(self, group: str, version: str, plural: str) -> bool:
        self._refused("serves")
        return self.served
