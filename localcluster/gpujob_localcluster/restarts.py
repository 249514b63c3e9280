"""Container restarts as the kubelet does them: the restart policy, crash-loop back-off, phase.

Pure: times are plain floats (seconds on a monotonic clock) handed in by the agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

INITIAL_BACKOFF = 10.0
MAX_BACKOFF = 300.0


RESTART: Final = "Restart"
RESTART_ALL: Final = "RestartAllContainers"
"""The container restart rules' actions (core/v1 ContainerRestartRule, KEP-5307 and
KEP-5532): restart this container, or every container of the pod in place."""


def rule_action(spec: Mapping[str, Any], exit_code: int) -> str | None:
    """The action of the container's first ``restartPolicyRules`` rule whose exit codes
    match (``In`` / ``NotIn`` its values), or None when none does."""
    for rule in spec.get("restartPolicyRules") or ():
        codes = rule.get("exitCodes") or {}
        values = set(codes.get("values") or ())
        op = codes.get("operator")
        if (op == "In" and exit_code in values) or (op == "NotIn" and exit_code not in values):
            return str(rule.get("action") or "")
    return None


def container_restart(spec: Mapping[str, Any], pod_policy: str, exit_code: int) -> bool:
    """Whether a regular container that exited is started again on its own: a matching
    rule's ``Restart`` first, then the container's own ``restartPolicy``, then the pod's
    (``RestartAllContainers`` restarts the whole pod instead, not this container alone)."""
    action = rule_action(spec, exit_code)
    if action == RESTART:
        return True
    if action == RESTART_ALL:
        return False
    return should_restart(str(spec.get("restartPolicy") or pod_policy), exit_code)


def should_restart(policy: str, exit_code: int) -> bool:
    """Whether a container that exited with ``exit_code`` is started again under ``policy``."""
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return exit_code != 0
    return False


@dataclass
class BackOff:
    """The kubelet's per-container crash-loop back-off.

    The first restart is immediate; each later one waits the current back-off, which then
    doubles (10 s, 20 s, 40 s ... 300 s). A container that ran for longer than twice the
    cap since the last restart starts over at no wait.
    """

    initial: float = INITIAL_BACKOFF
    cap: float = MAX_BACKOFF
    current: float | None = None
    last_restart: float | None = None

    def _expired(self, now: float) -> bool:
        return self.last_restart is None or now - self.last_restart > 2 * self.cap

    def wait_after(self, finished_at: float) -> float:
        """Seconds to wait, from ``finished_at``, before restarting the container."""
        if self.current is None or self._expired(finished_at):
            return 0.0
        return self.current

    def restarted(self, now: float) -> None:
        """Note a restart at ``now``: the next crash waits the doubled back-off."""
        if self.current is None or self._expired(now):
            self.current = self.initial
        else:
            self.current = min(self.current * 2, self.cap)
        self.last_restart = now


@dataclass(frozen=True)
class ContainerFate:
    """What the phase computation needs to know about one container."""

    running: bool
    exit_code: int | None = None
    restarting: bool = False


def pod_phase(
    fates: Sequence[ContainerFate],
    *,
    initialized: bool = True,
    init_failed: bool = False,
    others_alive: bool = False,
) -> str:
    """The pod phase from its regular containers, as the kubelet computes it.

    Pending until the init containers are done; Failed when one of them failed for good.
    Then Running while any regular container runs or waits for a restart; once every one
    has ended for good, Failed if any ended non-zero, else Succeeded. Sidecars never
    decide the phase, but a pod whose processes (``others_alive``: sidecars being stopped)
    still run has not reached its end yet.
    """
    if init_failed:
        return "Pending" if others_alive else "Failed"
    if not initialized or not fates:
        return "Pending"
    if any(f.running or f.restarting for f in fates):
        return "Running"
    if others_alive:
        return "Running"
    return "Failed" if any(f.exit_code for f in fates) else "Succeeded"


def backoff_message(delay: float, container: str, pod: str, namespace: str, uid: str) -> str:
    """The kubelet's CrashLoopBackOff message, word for word."""
    return (
        f"back-off {go_duration(delay)} restarting failed container={container} "
        f"pod={pod}_{namespace}({uid})"
    )


def go_duration(seconds: float) -> str:
    """Whole seconds the way Go prints a time.Duration: 10s, 1m20s, 5m0s."""
    total = round(seconds)
    minutes, secs = divmod(total, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
