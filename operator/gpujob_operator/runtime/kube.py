"""Blocking Kubernetes API calls the operator makes outside kopf, run off the event loop.

kopf watches and lists; everything that writes (pods, the Service, the job's status,
the job's deletion) goes through the official client here, in worker threads of its own
(:func:`in_api_thread`). Each call treats "already exists" and "already gone" as done,
because the level-based job loop re-applies the same plan after any crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import functools
import json
import logging
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.runtime import listing

log = logging.getLogger("gpujob.kube")

# The client imports each API module on first use (core_v1_api alone takes most of a
# second): import the ones the operator uses now, at start-up, never on the event loop.
_APIS: Final = (client.CoreV1Api, client.CustomObjectsApi, client.NetworkingV1Api)


EVIDENCE_WRITE_TIMEOUT: Final = 20.0
"""Seconds one write of a hang evidence ConfigMap may take."""
API_TIMEOUT: Final = 30.0
"""Seconds any other API call may take (connect and read each): a half-open connection
after a failover must not hold a job's lock, or a worker thread, for the kernel's minutes."""


class Fenced(Exception):
    """This replica may not write now: the standby guard has not confirmed it is the active
    one recently enough (peering). The write was not sent; the caller tries again later."""


class TimedApiClient(client.ApiClient):
    """An API client whose every call is bounded in time, and whose writes pass a fence.

    The official client sends no timeout unless each call passes ``_request_timeout``; one
    forgotten call is enough to hang a job loop on a dead connection. Setting it here, the
    one place every call goes through, solves the class. urllib3 would also try a call up
    to four times (three retries): here at most twice (one retry, for the stale pooled
    connection a server closed), so a call gives up after two timeouts at most. A timeout
    raises urllib3's errors, which the job loop retries with backoff like any transport error.

    ``may_write`` (the standby fence) is checked in the worker thread right before a write
    is sent: a write queued while the fence was open is not sent after it shut.
    """

    def __init__(
        self,
        configuration: client.Configuration | None = None,
        timeout: float = API_TIMEOUT,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        if configuration is None:
            configuration = client.Configuration.get_default_copy()
        configuration.retries = urllib3.Retry(
            total=1, connect=1, read=1, status=0, redirect=0, other=0
        )
        super().__init__(configuration)
        self.timeout = timeout
        self.may_write = may_write

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        method = str(args[0] if args else kwargs.get("method", "")).upper()
        if (
            method in WRITES
            and self.may_write is not None
            and not _dry_run(args, kwargs)
            and not self.may_write()
        ):
            raise Fenced(f"{method}: this replica is not confirmed active (peering)")
        if not kwargs.get("_request_timeout") and len(args) < 6:
            kwargs["_request_timeout"] = (self.timeout, self.timeout)
        return super().call_api(*args, **kwargs)


WRITES: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _dry_run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A dry-run request (``dryRun=All``) changes nothing: a standby may send it (the
    admission webhook answers on every replica)."""
    url = str(args[1] if len(args) > 1 else kwargs.get("url", ""))
    return "dryRun=" in url.partition("?")[2]


API_THREADS: Final = 64
"""Threads that wait on the API server for the operator's calls (and the size of the
client's connection pool). Not the default executor, whose 6 threads on 2 cores also run
the analysis of wide jobs and the forecast: a gang's CREATE_CONCURRENCY creates and every
other job's reads never queue behind CPU work, nor it behind them."""
_API_POOL: Final = concurrent.futures.ThreadPoolExecutor(
    API_THREADS, thread_name_prefix="gpujob-api"
)
P = ParamSpec("P")
R = TypeVar("R")


async def in_api_thread(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``asyncio.to_thread`` on the API threads: ``fn(*args, **kwargs)`` blocking there,
    with the caller's context."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await loop.run_in_executor(_API_POOL, call)


def unread(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``call`` (a typed client method) for its effect alone: a non-2xx answer still raises
    ApiException, but a 2xx answer (the whole pod, 400 KB for a wide job's) is drained off
    the connection and never decoded into the client's models, which took the GIL for tens
    of milliseconds per pod, 16 threads at a time in a gang's restart."""
    response = call(*args, _preload_content=False, **kwargs)
    response.drain_conn()
    response.release_conn()


class NameTaken(Exception):
    """An object of the name we write exists and is not owned by our job: left alone."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name} exists and is not this job's")
        self.kind, self.name = kind, name


class JobGone(Exception):
    """The job no longer exists (404), or another object now has its name."""


class Kube:
    """The few writes the job loop needs, each idempotent."""

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        timeout: float = API_TIMEOUT,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        if api_client is None:
            api_client = load_client(timeout)
        if isinstance(api_client, TimedApiClient):
            # The fence every write passes (None: always open), checked where the request is
            # sent: a replica frozen or cut off beyond its keep-alive writes nothing before
            # its guard has looked.
            api_client.may_write = may_write
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)

    async def create_pod(self, namespace: str, body: dict[str, Any], dry_run: bool = False) -> bool:
        """Create a pod; False when a pod of that name already exists.

        ``dry_run`` asks the server to admit and validate it without persisting
        (``dryRun=All``): the same refusals (quota, PodSecurity, webhooks, invalid fields),
        nothing created. RBAC-wise it is the same ``create`` verb. Unknown fields are
        refused (``fieldValidation=Strict``), never dropped: the template's pass-through
        fields keep what the CRD does not know, and a misspelt probe field silently dropped
        would change what the pod does.
        """
        query = [("fieldValidation", "Strict")]
        if dry_run:
            query.insert(0, ("dryRun", "All"))
        try:
            await in_api_thread(self._post_pod, namespace, body, query)
            return True
        except ApiException as e:
            if e.status == 409 or namespace_terminating(e):
                return False
            raise

    async def dry_run_pod(
        self,
        namespace: str,
        body: dict[str, Any],
        timeout: float,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        """Ask the API server to admit ``body`` without creating it (``dryRun=All``), with
        unknown fields refused (``fieldValidation=Strict``); raises what the server refused.
        Bounded by ``timeout`` seconds in all, retries included: the admission webhook's
        answer must come before the API server gives up on the webhook. ``executor``: the
        worker threads to block in (the webhook's own, so reviews never starve the job
        loops of the API threads).
        """
        query = [("dryRun", "All"), ("fieldValidation", "Strict")]
        loop = asyncio.get_running_loop()
        call = functools.partial(self._post_pod, namespace, body, query, timeout)
        await asyncio.wait_for(loop.run_in_executor(executor, call), timeout)

    def _post_pod(
        self,
        namespace: str,
        body: dict[str, Any],
        query: list[tuple[str, str]],
        timeout: float | None = None,
    ) -> None:
        """POST a pod as the plain JSON it is (blocking); raises the server's refusal.

        Not the typed ``create_namespaced_pod``: it checks the body against the client's own
        models first, so a pod core/v1 would refuse with a message naming the field (a PVC
        volume without ``claimName``) failed in the client instead, as an error the job
        loop can only retry, and an unknown field was dropped before the server saw it.
        """
        api = self.api_client
        request = api.param_serialize(
            method="POST",
            resource_path="/api/v1/namespaces/{namespace}/pods",
            path_params={"namespace": namespace},
            query_params=query,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        limit: dict[str, Any] = {"_request_timeout": (timeout, timeout)} if timeout else {}
        response = api.call_api(*request, **limit)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod (graceful, background); False when no pod of that name exists (a
        404 is proof that the pod is gone, whatever the operator's index still holds)."""
        try:
            await in_api_thread(
                unread,
                self.core.delete_namespaced_pod,
                name,
                namespace,
                propagation_policy="Background",
            )
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        return True

    async def patch_pod(
        self, namespace: str, name: str, uid: str | None, patch: dict[str, Any]
    ) -> bool:
        """Merge-patch a pod's metadata, only while it is the pod ``uid`` (a precondition:
        a pod recreated under the name is not touched); False when it is gone or replaced."""
        body = copy.deepcopy(patch)
        if uid:
            body.setdefault("metadata", {})["uid"] = uid
        try:
            await in_api_thread(unread, self.core.patch_namespaced_pod, name, namespace, body)
        except ApiException as e:
            if e.status in (404, 409, 422):
                return False
            raise
        return True

    async def pod_uids(self, namespace: str, selector: str) -> set[str]:
        """The uids of the pods the API server holds under a label selector, now: their
        metadata alone, page by page (a 2,048-pod job of 400 KB pods would otherwise come
        back as most of a gigabyte, decoded into the client's models)."""
        listed = await in_api_thread(
            listing.list_pages,
            functools.partial(self.core.list_namespaced_pod, namespace),
            children.uid_of,
            label_selector=selector,
            _headers=listing.METADATA_ONLY,
        )
        return set(listed.items)

    async def create_service(self, namespace: str, body: dict[str, Any]) -> None:
        await _create_or_keep(self.core.create_namespaced_service, namespace, body)

    async def create_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        """The job's NetworkPolicy (``lifecycle/endpoints.py``); one that exists is kept."""
        await _create_or_keep(self.networking.create_namespaced_network_policy, namespace, body)

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """The job's token Secret; one that exists is kept (create only: the operator may
        write Secrets, never read them)."""
        await _create_or_keep(self.core.create_namespaced_secret, namespace, body)

    async def service_exists(self, namespace: str, name: str) -> bool:
        try:
            await in_api_thread(self.core.read_namespaced_service, name, namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as the API server has it now; None when it does not exist."""
        try:
            got: Any = await in_api_thread(
                cast(Any, self.custom.get_namespaced_custom_object),
                api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            )  # fmt: skip
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return cast(dict[str, Any], got)

    async def patch_status(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A JSON merge patch of ``status`` through the status subresource.

        Returns the written object, or None when the job is gone (deleted meanwhile).
        """
        try:
            written: Any = await in_api_thread(
                cast(Any, self.custom.patch_namespaced_custom_object_status),
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": patch},
            )  # fmt: skip
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return cast(dict[str, Any], written)

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await in_api_thread(
                self.custom.delete_namespaced_custom_object,
                api.GROUP,
                api.VERSION,
                namespace,
                api.PLURAL,
                name,
                propagation_policy="Background",
            )
        except ApiException as e:
            if e.status != 404:
                raise

    async def put_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the ConfigMap, or replace the data of the one of that name if the same job
        (``body``'s controller) owns it. A ConfigMap of that name someone else owns is never
        overwritten: :class:`NameTaken`. The operator may not read ConfigMaps (it sees no
        other ConfigMap's data), so the owner is checked by the API server itself: a JSON
        patch whose ``test`` of the owner's uid fails (422) changes nothing. Each call is
        bounded (:data:`EVIDENCE_WRITE_TIMEOUT`): the stall's restart waits."""
        limit: dict[str, Any] = {"_request_timeout": EVIDENCE_WRITE_TIMEOUT}
        try:
            await in_api_thread(
                self.core.create_namespaced_config_map, namespace, cast(Any, body), **limit
            )
        except ApiException as e:
            if e.status != 409:
                raise
            name = body["metadata"]["name"]
            ours = children.controller_uid(body)
            if ours is None:
                raise NameTaken("ConfigMap", name) from None
            patch = [  # ours are created with one owner reference: the job
                {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": ours},
                {"op": "replace", "path": "/data", "value": body["data"]},
            ]
            try:
                await in_api_thread(
                    self.core.patch_namespaced_config_map,
                    name, namespace, cast(Any, patch), **limit,
                )  # fmt: skip
            except ApiException as refused:
                if refused.status == 422:  # the test failed: not owned by this job
                    raise NameTaken("ConfigMap", name) from None
                raise

    # -- gang admission objects (gang.py): Workload/PodGroup, Kueue Workload, ResourceFlavor
    async def create_object(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a namespaced custom object; False when it already exists."""
        ref = gang.ref_of(body)
        try:
            await in_api_thread(
                self.custom.create_namespaced_custom_object,
                ref.group, ref.version, namespace, ref.plural, body,
            )  # fmt: skip
            return True
        except ApiException as e:
            if e.status == 409 or namespace_terminating(e):
                return False
            raise

    async def delete_object(self, namespace: str, ref: gang.ObjectRef) -> None:
        try:
            await in_api_thread(
                self.custom.delete_namespaced_custom_object,
                ref.group, ref.version, namespace, ref.plural, ref.name,
                propagation_policy="Background",
            )  # fmt: skip
        except ApiException as e:
            if e.status != 404:
                raise

    async def get_object(self, namespace: str, ref: gang.ObjectRef) -> dict[str, Any] | None:
        """A namespaced custom object, or None when it does not exist.

        Only the server's NotFound of that object counts as "does not exist": a 404 because
        the API itself is not served (its CRD removed, its version dropped by an upgrade)
        is raised, so that the caller never takes a running gang's Workload for deleted.
        """
        try:
            obj: Any = await in_api_thread(
                self.custom.get_namespaced_custom_object,
                ref.group, ref.version, namespace, ref.plural, ref.name,
            )  # fmt: skip
        except ApiException as e:
            if e.status == 404 and object_not_found(e):
                return None
            raise
        return cast(dict[str, Any], obj)

    async def get_cluster_object(self, ref: gang.ObjectRef) -> dict[str, Any] | None:
        """A cluster-scoped custom object (a ResourceFlavor), or None."""
        try:
            obj: Any = await in_api_thread(
                self.custom.get_cluster_custom_object, ref.group, ref.version, ref.plural, ref.name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return cast(dict[str, Any], obj)

    async def patch_object_status(
        self, namespace: str, ref: gang.ObjectRef, patch: dict[str, Any]
    ) -> bool:
        """Merge-patch another object's status subresource.

        False when the object is gone or changed since it was read (409 on the patch's
        resourceVersion precondition): the caller's next pass re-reads it.
        """
        try:
            await in_api_thread(
                cast(Any, self.custom.patch_namespaced_custom_object_status),
                ref.group, ref.version, namespace, ref.plural, ref.name, patch,
            )  # fmt: skip
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (discovery)."""
        try:
            res: Any = await in_api_thread(self.custom.get_api_resources, group, version)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.name == plural for r in (res.resources or []))


async def _create_or_keep(create: Callable[..., Any], namespace: str, body: dict[str, Any]) -> None:
    """Create a job's child object; one that exists already (409), or a namespace being
    deleted, is fine: the object is kept as it is."""
    try:
        await in_api_thread(create, namespace, cast(Any, body))
    except ApiException as e:
        if e.status != 409 and not namespace_terminating(e):
            raise


def api_reason(e: ApiException) -> str:
    """The API server's message of a refusal (the Status body's message), else its reason."""
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


def object_not_found(e: ApiException) -> bool:
    """A 404 that says the object is missing (a Status of reason NotFound), as opposed to a
    path the server does not serve at all (plain ``404 page not found``)."""
    try:
        body = json.loads(e.body or "{}")
    except (ValueError, TypeError):
        return False
    return (
        isinstance(body, dict) and body.get("kind") == "Status" and body.get("reason") == "NotFound"
    )


def namespace_terminating(e: ApiException) -> bool:
    """The namespace is being deleted: creating in it is refused, and GC will take the job."""
    return e.status == 403 and "NamespaceTerminating" in str(e.body or "")


def load_client(timeout: float = API_TIMEOUT) -> TimedApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG``);
    every call of the client is bounded by ``timeout`` seconds (:class:`TimedApiClient`)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # A connection per API thread, and for the webhook's and the standby guard's threads.
    configuration.connection_pool_maxsize = API_THREADS + 8
    return TimedApiClient(configuration, timeout=timeout)
