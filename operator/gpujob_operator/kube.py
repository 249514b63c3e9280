"""Blocking Kubernetes API calls the operator makes outside kopf, run off the event loop.

kopf watches and lists; everything that writes (pods, the Service, the job's status,
the job's deletion) goes through the official client here, in worker threads via
``asyncio.to_thread``. Each call treats "already exists" and "already gone" as done,
because a level-based reconciler re-applies the same plan after any crash.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpujob_operator import api

log = logging.getLogger("gpujob.kube")


class Kube:
    """The few writes the reconciler needs, each idempotent."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        if api_client is None:
            api_client = load_client()
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a pod; False when a pod of that name already exists."""
        try:
            await asyncio.to_thread(self.core.create_namespaced_pod, namespace, cast(Any, body))
            return True
        except ApiException as e:
            if e.status == 409 or namespace_terminating(e):
                return False
            raise

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (graceful, background); a missing pod is fine."""
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_pod, name, namespace, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    async def create_service(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(self.core.create_namespaced_service, namespace, cast(Any, body))
        except ApiException as e:
            if e.status != 409 and not namespace_terminating(e):
                raise

    async def service_exists(self, namespace: str, name: str) -> bool:
        try:
            await asyncio.to_thread(self.core.read_namespaced_service, name, namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    async def patch_status(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A JSON merge patch of ``status`` through the status subresource.

        Returns the written object, or None when the job is gone (deleted meanwhile).
        """
        try:
            written: Any = await asyncio.to_thread(
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
            await asyncio.to_thread(
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


def namespace_terminating(e: ApiException) -> bool:
    """The namespace is being deleted: creating in it is refused, and GC will take the job."""
    return e.status == 403 and "NamespaceTerminating" in str(e.body or "")


def load_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG``)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()
