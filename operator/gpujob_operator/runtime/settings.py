"""The operator's settings: every ``GPUJOB_*`` variable, read once at start-up.

Why one object: the operator used to read its environment in a dozen places, some at import
time, so a typo in the chart surfaced late or never (a bad number fell back to a default in
silence). :func:`from_env` reads a mapping (``os.environ`` in production, a dict in tests)
and either returns a complete :class:`Settings` or raises :class:`SettingsError` naming
the variable, its value and what it must be; ``main`` turns that into a one-line exit
before kopf starts. Nothing else in the operator reads the environment.

| variable | default | what |
|---|---|---|
| ``GPUJOB_DEFAULT_GANG`` | ``None`` | gang mechanism of jobs that choose none |
| ``GPUJOB_KUEUE`` | off | ``1``: watch Kueue Workloads (Kueue is installed) |
| ``GPUJOB_PEERING`` | standalone | kopf peering object name: run as one of several replicas |
| ``GPUJOB_PEERING_CLUSTERWIDE`` | off | ``1``: the peering object is cluster-wide |
| ``GPUJOB_PEERING_LIFETIME`` | 60 | seconds a replica's keep-alive counts (>= 10) |
| ``POD_ID`` | host/pid | this replica's peering identity (the chart sets the pod's name) |
| ``GPUJOB_SCRAPE_CONCURRENCY`` | 64 | scrapes in flight, over every job |
| ``GPUJOB_SCRAPE_TIMEOUT`` | 5 | seconds one scrape may take |
| ``GPUJOB_WATCH_SERVER_TIMEOUT`` | 300 | kopf's server-side watch timeout |
| ``GPUJOB_WORKER_LIMIT`` | 200 | kopf's concurrent workers |
| ``GPUJOB_RETRY_BASE_SECONDS`` / ``..._MAX_SECONDS`` | 1 / 300 | backoff of failed API calls |
| ``GPUJOB_RESTART_BACKOFF_BASE_SECONDS`` / ``..._MAX_SECONDS`` | 10 / 360 | gang restarts |
| ``GPUJOB_GANG_GRACE_SECONDS`` | 10 | how long a refused, partial gang may hold resources |
| ``GPUJOB_LIVENESS`` | ``http://0.0.0.0:8080/healthz`` | kopf's health endpoint |
| ``GPUJOB_OPERATOR_METRICS_PORT`` / ``..._ADDR`` | 8081 / ``0.0.0.0`` | the operator's /metrics |
| ``GPUJOB_FAULT_EXIT_AT`` | unset | tests only: die at a named write boundary |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from gpujob_operator import api
from gpujob_operator.lifecycle import backoff
from gpujob_operator.lifecycle.planner import GANG_GRACE_SECONDS
from gpujob_operator.observability import opmetrics
from gpujob_operator.runtime import faults, peers

T = TypeVar("T")

DEFAULT_LIVENESS: Final = "http://0.0.0.0:8080/healthz"
GANGS: Final = (api.GANG_NONE, api.GANG_NATIVE, api.GANG_KUEUE)


class SettingsError(ValueError):
    """A ``GPUJOB_*`` variable holds a value the operator cannot run with."""


@dataclass(frozen=True)
class Settings:
    """Everything the operator process is configured with (defaults: an unset variable)."""

    default_gang: str = api.GANG_NONE
    kueue: bool = False
    peering: str = ""
    """The kopf peering object's name; empty: standalone (one replica)."""
    peering_clusterwide: bool = False
    peering_lifetime: int = peers.DEFAULT_LIFETIME
    pod_id: str | None = None
    scrape_concurrency: int = 64
    scrape_timeout: float = 5.0
    watch_server_timeout: int = 300
    worker_limit: int = 200
    retry: backoff.Policy = backoff.RETRY
    restart_backoff: backoff.Policy = backoff.RESTART
    gang_grace_seconds: float = GANG_GRACE_SECONDS
    liveness: str = DEFAULT_LIVENESS
    metrics_port: int = opmetrics.DEFAULT_PORT
    metrics_addr: str = "0.0.0.0"
    fault_exit_at: str | None = None

    @property
    def standalone(self) -> bool:
        """No peering: this replica is the only one and never pauses."""
        return not self.peering


def _read(
    env: Mapping[str, str],
    name: str,
    default: T,
    parse: Callable[[str], T],
    must: str,
    ok: Callable[[T], bool] = lambda _: True,
) -> T:
    """``env[name]`` parsed, or ``default`` when unset or empty; a bad value is refused."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise SettingsError(f"{name}={raw!r}: must be {must}")
    return value


def _positive_seconds(v: float) -> bool:
    return math.isfinite(v) and v > 0


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(raw)
    return raw == "1"


def from_env(env: Mapping[str, str]) -> Settings:
    """Read every setting from ``env``; raise :class:`SettingsError` on the first bad one."""
    seconds = "a number of seconds > 0"

    def policy(prefix: str, base: float, cap: float, jitter: float) -> backoff.Policy:
        b = _read(env, f"{prefix}_BASE_SECONDS", base, float, seconds, _positive_seconds)
        c = _read(env, f"{prefix}_MAX_SECONDS", cap, float, seconds, _positive_seconds)
        if c < b:
            raise SettingsError(f"{prefix}_MAX_SECONDS={c:g} must be >= the base ({b:g})")
        return backoff.Policy(b, c, jitter)

    return Settings(
        default_gang=_read(
            env,
            "GPUJOB_DEFAULT_GANG",
            api.GANG_NONE,
            str,
            "one of None, Native, Kueue",
            lambda v: v in GANGS,
        ),
        kueue=_read(env, "GPUJOB_KUEUE", False, _flag, "0 or 1"),
        peering=env.get("GPUJOB_PEERING", "").strip(),
        peering_clusterwide=_read(env, "GPUJOB_PEERING_CLUSTERWIDE", False, _flag, "0 or 1"),
        peering_lifetime=_read(
            env,
            peers.ENV_LIFETIME,
            peers.DEFAULT_LIFETIME,
            int,
            "whole seconds >= 10",
            lambda v: v >= 10,
        ),
        pod_id=env.get("POD_ID") or None,
        scrape_concurrency=_read(
            env, "GPUJOB_SCRAPE_CONCURRENCY", 64, int, "an integer >= 1", lambda v: v >= 1
        ),
        scrape_timeout=_read(env, "GPUJOB_SCRAPE_TIMEOUT", 5.0, float, seconds, _positive_seconds),
        watch_server_timeout=_read(
            env, "GPUJOB_WATCH_SERVER_TIMEOUT", 300, int, "whole seconds >= 1", lambda v: v >= 1
        ),
        worker_limit=_read(
            env, "GPUJOB_WORKER_LIMIT", 200, int, "an integer >= 1", lambda v: v >= 1
        ),
        retry=policy(
            "GPUJOB_RETRY",
            backoff.RETRY_BASE_SECONDS,
            backoff.RETRY_MAX_SECONDS,
            backoff.RETRY_JITTER,
        ),
        restart_backoff=policy(
            "GPUJOB_RESTART_BACKOFF",
            backoff.RESTART_BASE_SECONDS,
            backoff.RESTART_MAX_SECONDS,
            0.0,
        ),
        gang_grace_seconds=_read(
            env,
            "GPUJOB_GANG_GRACE_SECONDS",
            GANG_GRACE_SECONDS,
            float,
            seconds,
            _positive_seconds,
        ),
        liveness=env.get("GPUJOB_LIVENESS", "").strip() or DEFAULT_LIVENESS,
        metrics_port=_read(
            env,
            opmetrics.ENV_PORT,
            opmetrics.DEFAULT_PORT,
            int,
            "a port 0..65535 (0: off)",
            lambda v: 0 <= v <= 65535,
        ),
        metrics_addr=env.get(opmetrics.ENV_ADDR, "").strip() or "0.0.0.0",
        fault_exit_at=_read(
            env,
            faults.ENV,
            None,
            str,
            "one of " + ", ".join(faults.BOUNDARIES),
            lambda v: v in faults.BOUNDARIES,
        ),
    )
