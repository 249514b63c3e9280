"""Pure helpers that turn a pod spec into a process: env, ``$(VAR)`` expansion, hosts file.

Kept free of I/O so the node agent's behaviour around the pod contract is unit-tested.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")

CLUSTER_DOMAIN = "cluster.local"


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, others stay."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(repl, value)


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """Resolve a downward-API ``fieldRef.fieldPath`` against a pod dict (camelCase JSON)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return "" if simple[path] is None else str(simple[path])


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    lookup: Callable[[str, str, str], str | None] = lambda kind, name, key: None,
) -> dict[str, str]:
    """The env a container sees, in order, with ``$(VAR)`` expanded against earlier entries.

    ``lookup(kind, name, key)`` resolves ``configMapKeyRef``/``secretKeyRef`` values.
    """
    env: dict[str, str] = {}
    for src in container.get("envFrom", []) or []:
        prefix = src.get("prefix", "")
        for kind in ("configMapRef", "secretRef"):
            if kind in src:
                data = lookup(kind, src[kind]["name"], "*")
                if data:
                    for k, v in _parse_kv(data).items():
                        env[prefix + k] = v
    for item in container.get("env", []) or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        src = item.get("valueFrom")
        if not src:
            env[name] = ""
            continue
        if "fieldRef" in src:
            env[name] = field_ref(pod, src["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in src:
            env[name] = resource_field(container, src["resourceFieldRef"])
        elif "configMapKeyRef" in src or "secretKeyRef" in src:
            kind = "configMapKeyRef" if "configMapKeyRef" in src else "secretKeyRef"
            ref = src[kind]
            value = lookup(kind, ref["name"], ref["key"])
            if value is None and not ref.get("optional", False):
                raise ValueError(f"{kind} {ref['name']}/{ref['key']} for env {name} not found")
            if value is not None:
                env[name] = value
    return env


def _parse_kv(blob: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in blob.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """``resourceFieldRef``: a container's request or limit, with cpu rounded up like kubelet."""
    kind, _, res = str(ref["resource"]).partition(".")
    value = container.get("resources", {}).get(kind, {}).get(res)
    if value is None:
        return "0"
    value = str(value)
    if res == "cpu":
        millis = int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)
        return str(max(1, -(-millis // 1000)))
    return value


def pod_hostname(pod: Mapping[str, Any]) -> str:
    """The hostname a pod's processes see: ``spec.hostname`` or the pod name (63 chars)."""
    return str(pod.get("spec", {}).get("hostname") or pod["metadata"]["name"])[:63]


def dns_names(pod: Mapping[str, Any]) -> list[str]:
    """The cluster DNS names of a pod with ``hostname`` and ``subdomain`` set, longest first."""
    spec = pod.get("spec", {})
    sub = spec.get("subdomain")
    host = pod_hostname(pod)
    if not sub:
        return [host]
    ns = pod["metadata"]["namespace"]
    base = f"{host}.{sub}"
    return [f"{base}.{ns}.svc.{CLUSTER_DOMAIN}", f"{base}.{ns}.svc", f"{base}.{ns}", base, host]


def hosts_file(
    own: Mapping[str, Any], own_ip: str, peers: Sequence[tuple[Mapping[str, Any], str]]
) -> str:
    """An /etc/hosts for one pod: localhost, itself, and its subdomain peers that have addresses."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines.append(f"{own_ip}\t{' '.join(dns_names(own))}")
    for peer, ip in sorted(peers, key=lambda p: p[0]["metadata"]["name"]):
        if peer["metadata"]["name"] == own["metadata"]["name"]:
            continue
        lines.append(f"{ip}\t{' '.join(dns_names(peer))}")
    return "\n".join(lines) + "\n"


def termination_tail(text: str, max_lines: int = 80, max_bytes: int = 2048) -> str:
    """The log tail kubelet's FallbackToLogsOnError puts in a terminated container's message."""
    tail = "\n".join(text.splitlines()[-max_lines:])
    data = tail.encode()[-max_bytes:]
    return data.decode(errors="replace")


def kubernetes_service_env(host: str, port: int) -> dict[str, str]:
    """The ``kubernetes`` Service's variables every container gets (in-cluster clients read
    ``KUBERNETES_SERVICE_HOST``/``_PORT``); here they name the API server directly."""
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }
