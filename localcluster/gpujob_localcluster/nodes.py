"""The agent's nodes: what each one advertises, registering it, and its heartbeats.

The scheduler binds pods only to Ready nodes with room: every node advertises the same
:class:`NodeShape` (with ``nvidia.com/gpu`` when it has GPUs), posts a Ready status that
names its own loopback address (InternalIP) and the kubelet API's port there (``kubectl
logs``), and renews its Lease in ``kube-node-lease`` every heartbeat, as a kubelet does.
Each node has an address of its own (:func:`node_addresses`) because hostNetwork pods
take their node's address: two nodes' hostNetwork pods must not share ports.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_localcluster import dra
from gpujob_localcluster.podrun import now_iso

log = logging.getLogger("gpujob.nodeagent")

HEARTBEAT_SECONDS = 10.0
K8S_VERSION = "v1.37.2"


@dataclass
class NodeShape:
    """The capacity every registered node advertises."""

    gpus: int = 4
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"


def node_addresses(count: int, octet: int) -> list[str]:
    """One loopback address per node, ``127.255.<octet>.<i+1>``: apart from the pods'
    addresses (which the agent takes below 127.255) and, by ``octet``, from another
    cluster's nodes on the same machine."""
    if not 0 <= octet <= 254 or not 0 < count <= 254:
        raise ValueError(f"no node addresses for {count} nodes in 127.255.{octet}.0/24")
    return [f"127.255.{octet}.{i + 1}" for i in range(count)]


DECLARED_FEATURES = ("RestartAllContainersOnContainerExits",)


class Nodes:
    """Registers the agent's nodes and heartbeats them (node status and Lease)."""

    def __init__(
        self,
        api: client.ApiClient,
        names: list[str],
        shape: NodeShape,
        addresses: dict[str, str],
        kubelet_ports: dict[str, int],
        role_label: str = "gpujob.dev/local-node",
        features: tuple[str, ...] = DECLARED_FEATURES,
        taints: tuple[dict[str, str], ...] = (),
    ) -> None:
        self.role_label = role_label
        self.taints = taints
        """What keeps pods off these nodes unless they tolerate it (hollow nodes' own taint)."""
        """The label that tells this agent's nodes apart (local nodes from hollow ones)."""
        self.features = features
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.names = names
        self.shape = shape
        self.addresses = addresses
        """Node name -> its InternalIP (the hostIP of its pods, the podIP of hostNetwork ones)."""
        self.kubelet_ports = kubelet_ports
        """Node name -> the kubelet API's port on the node's address (0: none)."""

    def body(self, name: str) -> dict[str, Any]:
        """The Node object: labels and the shape's capacity."""
        capacity = {
            "cpu": self.shape.cpu,
            "memory": self.shape.memory,
            "pods": self.shape.pods,
            "ephemeral-storage": "100Gi",
        }
        if self.shape.gpus:
            capacity["nvidia.com/gpu"] = str(self.shape.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    self.role_label: "true",
                    "nvidia.com/gpu.present": "true" if self.shape.gpus else "false",
                },
            },
            "spec": {"taints": list(self.taints)} if self.taints else {},
            # What this agent implements that a pod may require of its node (the
            # scheduler's NodeDeclaredFeatures filter): restarts of every container in place.
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "declaredFeatures": list(self.features),
            },
        }

    def status(self, name: str) -> dict[str, Any]:
        """A status patch: Ready, no pressure, addresses, versions, the kubelet API port."""
        body = self.body(name)
        ts = now_iso()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "gpujob local node agent is posting ready status",
            "lastHeartbeatTime": ts,
            "lastTransitionTime": ts,
        }
        pressure = [
            {
                "type": t,
                "status": "False",
                "reason": f"KubeletHas{r}",
                "message": "ok",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t, r in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        return {
            "status": {
                **body["status"],
                "conditions": [ready, *pressure],
                "addresses": [
                    {"type": "InternalIP", "address": self.addresses[name]},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": K8S_VERSION,
                    "kubeProxyVersion": K8S_VERSION,
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "gpujob-local://1",
                    "osImage": "local processes",
                    "kernelVersion": os.uname().release,
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_ports.get(name, 0)}},
            }
        }

    def register(self) -> None:
        """Create every node (or take over an existing one), post its status, renew its Lease."""
        for name in self.names:
            self.register_node(name)
        self.renew_leases()
        self.publish_devices()

    def register_node(self, name: str) -> None:
        """Create the node (or take over an existing one) and post its status."""
        try:
            self.core.create_node(cast(Any, self.body(name)))
            log.info("registered node %s (gpus=%s)", name, self.shape.gpus)
        except ApiException as e:
            if e.status != 409:
                raise
        self.core.patch_node_status(name, self.status(name))

    def publish_devices(self) -> None:
        """Publish the DeviceClass and each node's ResourceSlice, as a DRA driver does
        (replacing what an earlier agent published). Skipped when the API does not serve
        resource.k8s.io/v1 or the nodes have no GPUs."""
        if not self.shape.gpus:
            return
        try:
            try:
                self.resource.create_device_class(cast(Any, dra.device_class()))
            except ApiException as e:
                if e.status != 409:  # it exists: nothing to change
                    raise
            for name in self.names:
                body = dra.resource_slice(name, self.shape.gpus)
                try:
                    self.resource.create_resource_slice(cast(Any, body))
                except ApiException as e:
                    if e.status != 409:
                        raise
                    old: Any = self.resource.read_resource_slice(body["metadata"]["name"])
                    body["metadata"]["resourceVersion"] = old.metadata.resource_version
                    self.resource.replace_resource_slice(body["metadata"]["name"], cast(Any, body))
        except ApiException as e:
            if e.status != 404:
                raise
            log.warning("resource.k8s.io/v1 is not served: no ResourceSlices published")

    def renew_leases(self) -> None:
        for name in self.names:
            self.renew_lease(name)

    def renew_lease(self, name: str) -> None:
        """Renew the node's Lease (the node lifecycle controller's heartbeat), creating it if gone."""
        body = {
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", body)
        except ApiException as e:
            if e.status != 404:
                raise
            with contextlib.suppress(ApiException):
                self.coord.create_namespaced_lease("kube-node-lease", cast(Any, body))

    def heartbeat_loop(self, stopping: threading.Event) -> None:
        """Post every node's status and renew its Lease every heartbeat until ``stopping``."""
        while not stopping.wait(HEARTBEAT_SECONDS):
            try:
                for name in self.names:
                    self.core.patch_node_status(name, self.status(name))
                self.renew_leases()
            except Exception as e:  # keep beating through API hiccups
                log.warning("heartbeat failed: %s", e)
