"""What the agent tells the API about its pods: status patches and Events.

A pod's status (phase, conditions, one entry per container) is rebuilt from what the
agent knows each time something changes. A patch the API does not take while it is down
is kept on the pod and resent, as a kubelet's status manager does, so an exit during an
API outage is never lost. Events are recorded as the kubelet records them: a repeat bumps
the count of the first instead of adding another.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_localcluster import initorder
from gpujob_localcluster.podrun import ContainerRun, PodRun, now_iso
from gpujob_localcluster.restarts import ContainerFate, pod_phase

log = logging.getLogger("gpujob.nodeagent")

POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


class PodReporter:
    """Patches pods' status and records Events on them."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self._recorded: dict[tuple[str, ...], tuple[str, int]] = {}
        """Events already posted: (pod uid, container, type, reason, message) -> (name, count)."""

    def publish(self, run: PodRun) -> None:
        """Patch the pod's status from what the agent knows: phase, conditions, containers."""
        regulars = run.of_kind("regular")
        inits = run.of_kind("init", "sidecar")
        sidecars = run.of_kind("sidecar")
        fates = [ContainerFate(c.running, c.exit_code, c.restart_at is not None) for c in regulars]
        phase = pod_phase(
            fates,
            initialized=run.initialized,
            init_failed=run.init_failed,
            others_alive=any(c.running for c in inits),
        )
        if run.in_place and not run.init_failed:
            phase = "Running"  # restarting every container in place: the pod stays Running
        # Sidecars' readiness counts towards the pod's, as the kubelet counts it.
        ready = phase == "Running" and all(c.ready for c in regulars + sidecars)
        pending = initorder.incomplete(init_fates(run))
        ts = now_iso()
        wanted = {
            "PodReadyToStartContainers": "True",
            # The kubelet keeps Initialized True through an in-place restart of every container.
            "Initialized": "True" if run.initialized or run.in_place else "False",
            "ContainersReady": "True" if ready else "False",
            "Ready": "True" if ready else "False",
        }
        conds = [{"type": "PodScheduled", "status": "True"}]
        for ctype in POD_CONDITIONS:
            status = wanted[ctype]
            cond = stamped(run, ctype, status, ts)
            if status == "False" and ctype == "Initialized":
                cond["reason"] = "ContainersNotInitialized"
                cond["message"] = f"containers with incomplete status: [{' '.join(pending)}]"
            elif status == "False" and ctype in ("ContainersReady", "Ready"):
                if phase in ("Succeeded", "Failed"):
                    cond["reason"] = "PodCompleted"
                else:
                    cond["reason"] = "ContainersNotReady"
                    unready = [c.name for c in regulars + sidecars if not c.ready]
                    cond["message"] = f"containers with unready status: [{' '.join(unready)}]"
            conds.append(cond)
        if run.restarting_all or ALL_RESTARTING in run.conditions:
            conds.append(all_restarting(run, ts))
        status_patch: dict[str, Any] = {
            "phase": phase,
            "podIP": run.ip,
            "podIPs": [{"ip": run.ip}],
            "hostIP": run.host_ip,
            "hostIPs": [{"ip": run.host_ip}],
            "startTime": run.started_at,
            "conditions": conds,
            "containerStatuses": [container_status(c) for c in regulars],
        }
        if inits:
            status_patch["initContainerStatuses"] = [container_status(c) for c in inits]
        self.patch_status(run.pod, status_patch, run)

    def patch_status(
        self, pod: dict[str, Any], status: dict[str, Any], run: PodRun | None = None
    ) -> None:
        """Send a pod's status; with ``run``, one the API refuses is kept and resent later."""
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        except ApiException as e:
            log.warning(
                "status update of %s/%s failed: %s", meta["namespace"], meta["name"], e.reason
            )
            if e.status is None or not (e.status >= 500 or e.status == 429):
                status = {}  # gone (404) or refused for good: resending cannot help
        except Exception as e:  # the API server is down: keep the status for a later resend
            log.warning(
                "status update of %s/%s failed (%s); resending",
                meta["namespace"],
                meta["name"],
                type(e).__name__,
            )
        else:
            status = {}
        if run is not None:
            # A later status supersedes an unsent one only where it says something.
            run.unsent = {**(run.unsent or {}), **status} if status else None

    def event(
        self, run: PodRun, type_: str, reason: str, message: str, container: str | None = None
    ) -> None:
        """Record an Event on the pod, as the kubelet does: a repeat of the same event bumps
        its count instead of adding another (failures are only logged)."""
        ts = now_iso()
        message = message[:1024]
        key = (run.uid, container or "", type_, reason, message)
        seen = self._recorded.get(key)
        try:
            if seen is not None:
                name, count = seen
                self.core.patch_namespaced_event(
                    name, run.namespace, {"count": count + 1, "lastTimestamp": ts}
                )
                self._recorded[key] = (name, count + 1)
                return
            involved: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": run.namespace,
                "name": run.name,
                "uid": run.uid,
            }
            if container:
                crun = run.container(container)
                field = "containers" if crun is None or crun.kind == "regular" else "initContainers"
                involved["fieldPath"] = f"spec.{field}{{{container}}}"
            body = {
                "metadata": {"generateName": f"{run.name}.", "namespace": run.namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": "kubelet", "host": run.pod["spec"].get("nodeName", "")},
                "firstTimestamp": ts,
                "lastTimestamp": ts,
                "count": 1,
            }
            created: Any = self.core.create_namespaced_event(run.namespace, cast(Any, body))
            if len(self._recorded) > 4096:
                self._recorded.clear()
            self._recorded[key] = (created.metadata.name, 1)
        except ApiException as e:
            self._recorded.pop(key, None)
            log.debug("event %s on %s not recorded: %s", reason, run.key, e.reason)


ALL_RESTARTING = "AllContainersRestarting"


def stamped(run: PodRun, ctype: str, status: str, ts: str) -> dict[str, Any]:
    """Condition ``ctype`` at ``status``, its transition time moved only when the status
    changes (kept in ``run.conditions``)."""
    old = run.conditions.get(ctype)
    if old is None or old[0] != status:
        run.conditions[ctype] = (status, ts)
    return {"type": ctype, "status": status, "lastTransitionTime": run.conditions[ctype][1]}


def all_restarting(run: PodRun, ts: str) -> dict[str, Any]:
    """The AllContainersRestarting condition: True from a ``RestartAllContainers`` exit
    until no container of the pod is left, then False (present from its first time on)."""
    cond = stamped(run, ALL_RESTARTING, "True" if run.restarting_all else "False", ts)
    if run.restarting_all:
        cond["reason"] = "RestartAllContainersStarted"
        cond["message"] = f"container {run.restart_all_trigger} exited with restart policy rule"
    else:
        cond["reason"] = "AllContainersRestartCleanedUp"
    return cond


def init_fates(run: PodRun) -> list[initorder.InitFate]:
    """The pod's init containers as :mod:`initorder` sees them."""
    return [
        initorder.InitFate(
            name=c.name,
            sidecar=c.kind == "sidecar",
            attempted=c.attempt > 0 and not c.cleared,
            started=c.started,
            succeeded=c.succeeded,
            failed=c.ended and c.exit_code not in (None, 0) and c.restart_at is None,
        )
        for c in run.of_kind("init", "sidecar")
    ]


def terminated(crun: ContainerRun) -> dict[str, Any]:
    """A container's ``terminated`` state: its last attempt's exit."""
    term: dict[str, Any] = {
        "exitCode": crun.exit_code,
        "reason": crun.reason,
        "startedAt": crun.started_at,
        "finishedAt": crun.finished_at or now_iso(),
        "containerID": f"local://{crun.proc.pid if crun.proc else 0}",
    }
    if crun.message:
        term["message"] = crun.message
    return term


def container_status(crun: ContainerRun) -> dict[str, Any]:
    """A container's entry in ``containerStatuses`` (or ``initContainerStatuses``): not
    started yet, running, waiting to restart, or ended."""
    # A plain init container that exited 0 counts as ready, as the kubelet reports it.
    ready = crun.succeeded if crun.kind == "init" else crun.ready
    base: dict[str, Any] = {
        "name": crun.name,
        "image": crun.spec.get("image", ""),
        "imageID": "",
        "restartCount": crun.restart_count,
        "containerID": f"local://{crun.proc.pid if crun.proc else 0}",
        "lastState": crun.last_state,
        "ready": ready,
        "started": crun.started,
    }
    if crun.attempt == 0 or crun.cleared:  # it waits for the init containers before it
        if crun.cleared and crun.waiting is not None:  # the pod's restart backs off
            reason, message = crun.waiting
            return {**base, "state": {"waiting": {"reason": reason, "message": message}}}
        return {**base, "state": {"waiting": {"reason": "PodInitializing"}}}
    if crun.running:
        return {**base, "state": {"running": {"startedAt": crun.started_at}}}
    if crun.waiting is not None and crun.restart_at is not None:
        reason, message = crun.waiting
        # While it waits, the last attempt is the container's last state.
        last = {"terminated": terminated(crun)}
        return {
            **base,
            "lastState": last,
            "state": {"waiting": {"reason": reason, "message": message}},
        }
    return {**base, "state": {"terminated": terminated(crun)}}
