"""Pure builders of the job's children: the headless Service and one pod per node.

Plain dicts in the API's camelCase JSON, ready for any client (kopf, kubernetes, kubectl).

Contract: pod ``<job>-node-<i>`` with ``hostname`` and ``subdomain``
so ``<job>-node-0.<job>`` resolves through the headless Service ``<job>``; the torchrun /
Kubeflow PyTorchJob env (``MASTER_ADDR``, ``WORLD_SIZE`` = nodes, ``RANK`` = node rank,
``PET_*``); one pod per node, ``restartPolicy: Never`` (the operator restarts the gang).

Decisions:

* Env: the operator's rendezvous and ``GPUJOB_*`` variables come first and always win (the
  API refuses user values for them, see ``api.RESERVED_ENV``); any other operator default
  (``PYTHONUNBUFFERED``, the Flight Recorder's ``contract.FLIGHT_RECORDER_ENV``) is replaced
  by a user entry of the same name. User entries follow, so their ``$(VAR)`` references can
  use the operator's variables.
* Command with ``launcher: torchrun``: ``python -m M args`` -> ``torchrun <flags> -m M args``;
  ``python S args`` -> ``torchrun <flags> S args`` (torchrun runs S with its own interpreter);
  anything else (including ``python -u ...``) -> ``torchrun <flags> --no-python CMD``.
  Flags: static rendezvous on rank 0 with an explicit timeout
  (``--rdzv-backend=static --rdzv-conf=timeout=T``) and ``--max-restarts=0``: a local
  restart cannot rejoin a static gang, so failures surface to the operator.
  ``spec.args`` become the container's ``args`` (appended by the kubelet).
* The attempt is a label, not part of the name: names stay stable DNS names and a new
  attempt's pod can only be created once its old namesake is gone (no duplicates).
* Profiles: ``GPUJOB_PROFILE_DIR`` is ``spec.monitoring.profile.path`` (a mounted volume the
  API checked), else an emptyDir ``gpujob-profiles`` mounted at ``/var/run/gpujob/profiles``
  (skipped when the template mounts something at that very path: then that is the place).
* ``terminationMessagePolicy: FallbackToLogsOnError``: a failed container's last log lines
  reach ``state.terminated.message`` even when the log cannot be fetched any more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api.children import (
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    LABEL_NODE_RANK,
    LABEL_PREFIX,
    MANAGED_BY,
    job_meta,
    master_addr,
    owner_reference,
    pod_name,
    selector_labels,
)
from gpujob_operator.api.hostports import RankPorts, metrics_port_name, rank_ports
from gpujob_operator.api.names import ENV_PROFILE_DIR, PROFILE_DEFAULT_DIR, PROFILE_VOLUME
from gpujob_operator.api.pod.template import MERGED_FIELDS, TRAINER_FIELDS
from gpujob_operator.api.profile import profile_dir
from gpujob_trainer import contract
from gpujob_trainer.contract import ENV_METRICS_ADDR, ENV_NODE_NAME

CONTAINER_NAME: Final = "trainer"
SHM_VOLUME: Final = "gpujob-shm"
RENDEZVOUS_PORT_NAME: Final = "rendezvous"

_PYTHON = re.compile(r"python(3(\.\d+)?)?")


def _spec(job: Mapping[str, Any], spec: api.GPUTrainingJobSpec | None) -> api.GPUTrainingJobSpec:
    return spec if spec is not None else api.parse_spec(job["spec"])


def build_service(
    job: Mapping[str, Any], spec: api.GPUTrainingJobSpec | None = None
) -> dict[str, Any]:
    """Headless Service ``<job>``: gives each pod a DNS name, ready or not.

    ``publishNotReadyAddresses`` because ranks must resolve rank 0 before anything is
    ready (there are no readiness probes; rendezvous is the readiness).
    """
    spec = _spec(job, spec)
    name, namespace, _ = job_meta(job)
    port = job_ports(job, spec).master
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def job_ports(job: Mapping[str, Any], spec: api.GPUTrainingJobSpec) -> RankPorts:
    """The job's metrics and rendezvous ports (a block of its own on the host network)."""
    name, namespace, uid = job_meta(job)
    return rank_ports(spec, uid or f"{namespace}/{name}")


def profile_volume(
    spec: api.GPUTrainingJobSpec, mounts: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The emptyDir for traces and its mount, when the job names no path of its own and
    does not mount something at the default path itself, or read-only above it (the mount
    point could not be made there, and the pod would not start)."""
    if spec.monitoring.profile.path is not None:
        return None
    for m in mounts:
        at = str(m.get("mountPath", "")).rstrip("/")
        if at == PROFILE_DEFAULT_DIR:
            return None
        if m.get("readOnly") and (PROFILE_DEFAULT_DIR + "/").startswith(at + "/"):
            return None
    return (
        {"name": PROFILE_VOLUME, "emptyDir": {}},
        {"name": PROFILE_VOLUME, "mountPath": PROFILE_DEFAULT_DIR},
    )


def build_env(
    job_name: str,
    namespace: str,
    spec: api.GPUTrainingJobSpec,
    node_rank: int,
    ports: RankPorts | None = None,
) -> list[dict[str, Any]]:
    """The container env: operator contract first, then the user's (see module doc)."""
    t = spec.training
    ports = ports or RankPorts(t.metrics_port, t.master_port, on_host=False)
    addr = master_addr(job_name)
    owned: list[tuple[str, str]] = [
        ("MASTER_ADDR", addr),
        ("MASTER_PORT", str(ports.master)),
        ("WORLD_SIZE", str(spec.nodes)),
        ("RANK", str(node_rank)),
        ("PET_NNODES", str(spec.nodes)),
        ("PET_NPROC_PER_NODE", str(spec.procs_per_node)),
        ("PET_NODE_RANK", str(node_rank)),
        ("PET_MASTER_ADDR", addr),
        ("PET_MASTER_PORT", str(ports.master)),
        (api.ENV_METRICS_PORT, str(ports.metrics)),
        (api.ENV_JOB_NAME, job_name),
        (api.ENV_NAMESPACE, namespace),
        (ENV_PROFILE_DIR, profile_dir(spec)),
    ]
    if t.total_steps is not None:
        owned.append((api.ENV_TOTAL_STEPS, str(t.total_steps)))
    user = [e for e in spec.env or () if e.name not in api.RESERVED_ENV]
    user_names = {e.name for e in user}
    # The Flight Recorder on (bounded), so a hang leaves a collective trace to compare.
    defaults = [("PYTHONUNBUFFERED", "1"), *contract.flight_recorder_env(user_names)]
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in owned]
    if ENV_METRICS_ADDR not in user_names:
        # Bind the exporter to the pod's own address: correct on a real cluster, and it keeps
        # ranks of two pods apart where pods share a network namespace (the local node agent).
        env.append(
            {"name": ENV_METRICS_ADDR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        )
    if spec.run_policy.preflight.enabled:
        # The check names the node it failed on.
        env.append(
            {"name": ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        )
    env += [{"name": k, "value": v} for k, v in defaults if k not in user_names]
    env += [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in user]
    return env


def _python_form(command: list[str]) -> list[str] | None:
    """torchrun's own form of a ``python -m M ...`` / ``python S ...`` command, else None."""
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    if len(command) >= 3 and command[1] == "-m":
        return ["-m", *command[2:]]
    if len(command) >= 2 and not command[1].startswith("-"):
        return command[1:]
    return None


def torchrun_command(
    job_name: str, spec: api.GPUTrainingJobSpec, node_rank: int, master_port: int | None = None
) -> list[str]:
    """``torchrun`` with static rendezvous on rank 0, wrapping the user's command."""
    t = spec.training
    flags = [
        "torchrun",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr(job_name)}",
        f"--master-port={t.master_port if master_port is None else master_port}",
        "--rdzv-backend=static",
        f"--rdzv-conf=timeout={t.rdzv_timeout_seconds}",
        "--max-restarts=0",
    ]
    command = list(spec.command or [])
    python_form = _python_form(command)
    if python_form is not None:
        return flags + python_form
    return [*flags, "--no-python", *command]


def runs_python(spec: api.GPUTrainingJobSpec) -> bool:
    """Whether the job's command names a Python interpreter, or runs under torchrun (whose
    image has one): what runs gpujob_trainer's modules in the pod is then known."""
    command = list(spec.command or [])
    named = bool(command) and bool(_PYTHON.fullmatch(os.path.basename(command[0])))
    return named or (bool(command) and spec.training.launcher == "torchrun")


def job_python(spec: api.GPUTrainingJobSpec) -> str:
    """The interpreter that runs gpujob_trainer's own modules in the pod: the user's where
    the command names one, else ``python3``."""
    command = list(spec.command or [])
    return command[0] if command and _PYTHON.fullmatch(os.path.basename(command[0])) else "python3"


def preflight_command(spec: api.GPUTrainingJobSpec, port: int) -> list[str]:
    """``python -m gpujob_trainer.preflight`` with the job's limits, up to its ``--``: run by
    the user's own interpreter where the command names one, else ``python3``."""
    p = spec.run_policy.preflight
    python = job_python(spec)
    out = [
        python, "-m", "gpujob_trainer.preflight",
        f"--min-relative={p.min_relative_speed:g}",
        f"--min-peak-ratio={p.min_peak_ratio:g}",
        f"--timeout={p.timeout_seconds}",
        f"--port={port}",
    ]  # fmt: skip
    if p.min_gemm_tflops is not None:
        out.append(f"--min-tflops={p.min_gemm_tflops:g}")
    if p.min_bus_bandwidth_gbps is not None:
        out.append(f"--min-bus-gbps={p.min_bus_bandwidth_gbps:g}")
    return [*out, "--"]


SUPERVISOR_GRACE_SECONDS: Final = 5
"""How long a stale run has to exit on SIGTERM before the supervisor kills it."""


def supervisor_command(spec: api.GPUTrainingJobSpec) -> list[str]:
    """``python -m gpujob_trainer.supervisor`` up to its ``--`` (in-place restarts)."""
    return [
        job_python(spec), "-m", contract.SUPERVISOR_MODULE,
        f"--podinfo={contract.PODINFO_DIR}",
        f"--state={contract.INPLACE_STATE_DIR}",
        f"--grace={SUPERVISOR_GRACE_SECONDS}",
        "--",
    ]  # fmt: skip


def container_command(
    job_name: str,
    spec: api.GPUTrainingJobSpec,
    node_rank: int,
    master_port: int | None = None,
    in_place: bool = False,
) -> list[str] | None:
    """The container's ``command``: wrapped by torchrun, or the user's as is (None = image's);
    behind the pre-flight check when ``runPolicy.preflight`` is on (it then becomes it), and
    under the restart supervisor when the pod restarts in place."""
    if spec.training.launcher == "torchrun":
        command: list[str] | None = torchrun_command(job_name, spec, node_rank, master_port)
    else:
        command = list(spec.command) if spec.command else None
    if command and spec.run_policy.preflight.enabled:
        master = spec.training.master_port if master_port is None else master_port
        command = [*preflight_command(spec, master + 1), *command]
    if command and in_place:
        command = [*supervisor_command(spec), *command]
    return command


_OPERATOR_ANNOTATIONS: Final = frozenset(
    {
        contract.ANNOTATION_RELEASED,
        contract.ANNOTATION_RESTARTS_BASE,
        contract.ANNOTATION_HOLD,
    }
)
"""Pod annotations only the operator sets (in-place restarts): a template's are dropped."""
INPLACE_VOLUME: Final = "gpujob-inplace"
PODINFO_VOLUME: Final = "gpujob-podinfo"


def restart_rules(spec: api.GPUTrainingJobSpec) -> list[dict[str, Any]]:
    """The trainer's restart rule for in-place restarts: a failure the job retries restarts
    every container of the pod (with ``retryableExitCodes`` set, only those codes, and the
    supervisor's own); never a pre-flight check's (a node that failed it is left, not
    restarted on) nor a success."""
    codes = spec.run_policy.retryable_exit_codes
    if codes is None:
        match = {"operator": "NotIn", "values": [0, contract.PREFLIGHT_EXIT_CODE]}
    else:
        kept = set(codes) - {0, contract.PREFLIGHT_EXIT_CODE}
        match = {"operator": "In", "values": sorted(kept | {contract.RESTART_EXIT_CODE})}
    return [{"action": "RestartAllContainers", "exitCodes": match}]


def in_place_parts(
    spec: api.GPUTrainingJobSpec,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
) -> None:
    """Make the trainer restart its pod in place: its restart rule, the supervisor's state
    (an emptyDir, kept across restarts) and the pod's labels and annotations (the downward
    API: the attempt it belongs to, and the release)."""
    container["restartPolicy"] = "Never"
    container["restartPolicyRules"] = restart_rules(spec)
    volumes.append({"name": INPLACE_VOLUME, "emptyDir": {}})
    volumes.append(
        {
            "name": PODINFO_VOLUME,
            "downwardAPI": {
                "items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                ]
            },
        }
    )
    mounts.append({"name": INPLACE_VOLUME, "mountPath": contract.INPLACE_STATE_DIR})
    mounts.append({"name": PODINFO_VOLUME, "mountPath": contract.PODINFO_DIR, "readOnly": True})


_QUANTITY_MAPS: Final = frozenset({"requests", "limits", "overhead"})
_QUANTITY_KEYS: Final = frozenset({"sizeLimit", "divisor"})


def quantities_as_strings(node: Any, key: str = "") -> Any:
    """The same pod with every resource quantity a string (``cpu: 4`` -> ``"4"``).

    YAML makes ``cpu: 4`` a number; the API server takes it, but the Kubernetes client's
    typed models refuse a number where a quantity string belongs, and the pod would never
    be created.
    """
    if isinstance(node, dict):
        if key in _QUANTITY_MAPS:
            return {k: str(v) if isinstance(v, int | float) else v for k, v in node.items()}
        return {
            k: str(v)
            if k in _QUANTITY_KEYS and isinstance(v, int | float) and not isinstance(v, bool)
            else quantities_as_strings(v, k)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [quantities_as_strings(v, key) for v in node]
    return node


def _resources(spec: api.GPUTrainingJobSpec) -> dict[str, Any]:
    requests = dict(spec.resources.requests or {}) if spec.resources else {}
    limits = dict(spec.resources.limits or {}) if spec.resources else {}
    claims = [api.dump(c) for c in spec.resources.claims or ()] if spec.resources else []
    if spec.gpus_per_node > 0 and spec.gpus_from == "DevicePlugin":
        # Extended resources must have requests == limits.
        requests[api.GPU_RESOURCE] = str(spec.gpus_per_node)
        limits[api.GPU_RESOURCE] = str(spec.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    if claims:
        out["claims"] = claims
    return out


def container_ports(spec: api.GPUTrainingJobSpec, ports: RankPorts) -> list[dict[str, Any]]:
    """The operator's ports: ``metrics-<i>`` per local rank, then the rendezvous port.

    On the host network each is also a hostPort, so the scheduler's NodePorts filter keeps
    two pods that would bind the same port off one node, and the scraper reads the ports
    back from the pod.
    """
    out = [
        {"name": metrics_port_name(i), "containerPort": ports.metrics + i, "protocol": "TCP"}
        for i in range(spec.procs_per_node)
    ]
    out.append({"name": RENDEZVOUS_PORT_NAME, "containerPort": ports.master, "protocol": "TCP"})
    if ports.on_host:
        for p in out:
            p["hostPort"] = p["containerPort"]
    return out


def build_pod(
    job: Mapping[str, Any],
    node_rank: int,
    attempt: int,
    spec: api.GPUTrainingJobSpec | None = None,
    in_place: bool = False,
) -> dict[str, Any]:
    """Pod ``<job>-node-<rank>`` of gang attempt ``attempt`` (restarting in place, or not)."""
    spec = _spec(job, spec)
    name, namespace, _ = job_meta(job)
    tpl = spec.template or api.PodTemplate()
    pname = pod_name(name, node_rank)

    labels = {k: v for k, v in (tpl.labels or {}).items() if not k.startswith(LABEL_PREFIX)}
    labels.update(
        {
            LABEL_JOB_NAME: name,
            LABEL_NODE_RANK: str(node_rank),
            LABEL_ATTEMPT: str(attempt),
            LABEL_MANAGED_BY: MANAGED_BY,
        }
    )
    ports = job_ports(job, spec)
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": spec.image}
    in_place = in_place and bool(spec.command)
    command = container_command(name, spec, node_rank, ports.master, in_place)
    if command is not None:
        container["command"] = command
    if spec.args:
        container["args"] = list(spec.args)
    container["env"] = build_env(name, namespace, spec, node_rank, ports)
    wire = api.dump(tpl)
    container["ports"] = container_ports(spec, ports) + list(wire.get("ports", []))
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    mounts = list(wire.get("volumeMounts", []))
    volumes = list(wire.get("volumes", []))
    if tpl.shm_size is not None:
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": tpl.shm_size}}
        )
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    profiles = profile_volume(spec, mounts)
    if profiles is not None:
        volumes.append(profiles[0])
        mounts.append(profiles[1])
    if in_place:
        in_place_parts(spec, container, volumes, mounts)
    if mounts:
        container["volumeMounts"] = mounts
    if tpl.container_security_context:
        container["securityContext"] = wire["containerSecurityContext"]
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container.update({k: wire[k] for k in TRAINER_FIELDS if k in wire})

    pod_spec: dict[str, Any] = {
        "hostname": pname,
        "subdomain": name,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": tpl.termination_grace_period_seconds,
    }
    if ports.on_host:
        # Ranks resolve each other through the cluster's DNS, which Default would skip.
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    pod_spec.update(
        {k: v for k, v in wire.items() if k not in MERGED_FIELDS and k not in TRAINER_FIELDS}
    )
    pod_spec["containers"] = [container, *wire.get("containers", [])]
    if volumes:
        pod_spec["volumes"] = volumes

    metadata: dict[str, Any] = {
        "name": pname,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }
    annotations = {
        k: v for k, v in (tpl.annotations or {}).items() if k not in _OPERATOR_ANNOTATIONS
    }
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": quantities_as_strings(pod_spec),
    }
