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
| ``GPUJOB_KUEUE`` | ``0`` | ``1``: watch Kueue Workloads (Kueue is installed) |
| ``GPUJOB_PEERING`` | standalone | kopf peering object name: run as one of several replicas |
| ``GPUJOB_PEERING_CLUSTERWIDE`` | ``0`` | ``1``: the peering object is cluster-wide (with peering) |
| ``GPUJOB_PEERING_LIFETIME`` | 60 | seconds a replica's keep-alive counts (>= 10; with peering) |
| ``POD_ID`` | host/pid | this replica's peering identity (the chart sets the pod's name) |
| ``GPUJOB_SCRAPE_CONCURRENCY`` | 64 | scrapes in flight, over every job |
| ``GPUJOB_SCRAPE_TIMEOUT`` | 5 | seconds one scrape may take |
| ``GPUJOB_MAX_JOB_POD_BYTES`` | 67108864 | bytes of pods one job may ask for (template x nodes, ``api/podbytes.py``; 0: no bound); over it, refused at apply and never created |
| ``GPUJOB_SCRAPE_CPU_CORES`` | 1 | operator CPU (cores) every job's scrapes share; a job over its fair share is scraped less often, and told so |
| ``GPUJOB_API_TIMEOUT`` | 30 | seconds one API call may take (connect, then read) |
| ``GPUJOB_WATCH_SERVER_TIMEOUT`` | 300 | kopf's server-side watch timeout |
| ``GPUJOB_WORKER_LIMIT`` | 200 | kopf's concurrent workers |
| ``GPUJOB_RETRY_BASE_SECONDS`` / ``..._MAX_SECONDS`` | 1 / 300 | backoff of failed API calls |
| ``GPUJOB_RESTART_BACKOFF_BASE_SECONDS`` / ``..._MAX_SECONDS`` | 10 / 360 | gang restarts |
| ``GPUJOB_GANG_GRACE_SECONDS`` | 10 | how long a refused, partial gang may hold resources |
| ``GPUJOB_LIVENESS`` | ``http://0.0.0.0:8080/healthz`` | kopf's health endpoint (set empty: none) |
| ``GPUJOB_OPERATOR_METRICS_PORT`` / ``..._ADDR`` | 8081 / ``0.0.0.0`` | the operator's /metrics |
| ``GPUJOB_FORECAST_INTERVAL`` | 30 | seconds between start-time forecasts of waiting jobs (0: off) |
| ``GPUJOB_WEBHOOK_PORT`` | 0 | port of the admission webhook (HTTPS; 0: off) |
| ``GPUJOB_WEBHOOK_ADDR`` | ``0.0.0.0`` | address the webhook binds |
| ``GPUJOB_WEBHOOK_CERT`` / ``..._KEY`` | unset | the webhook's serving certificate and key (PEM files; required with a port) |
| ``GPUJOB_WEBHOOK_CA`` | unset | the CA that signed it (PEM file), for a registration of its own |
| ``GPUJOB_WEBHOOK_CLIENT_CA`` | unset | answer only callers with a client certificate this CA signed (the API server's, from its AdmissionConfiguration) |
| ``GPUJOB_WEBHOOK_REGISTER`` | unset | host mode: register a ValidatingWebhookConfiguration of this name at ``https://127.0.0.1:<port>`` and delete it on exit (the chart registers its own instead) |
| ``GPUJOB_JOB_NETWORK_POLICY`` | unset | JSON ``{"metricsFrom": [peers], "otherPortsOpen": bool}``: a NetworkPolicy per job (``lifecycle/endpoints.py``); unset: none |
| ``GPUJOB_ENDPOINT_TOKEN_KEY_FILE`` | unset | a file holding the key of the jobs' endpoint tokens (>= 32 bytes); unset: no tokens |
| ``GPUJOB_HOST_PORT_RANGE`` | ``20000-29999`` | node ports the operator may scrape for ``hostNetworkPorts: Spec`` jobs on the host network |
| ``GPUJOB_GC_FREEZE_SECONDS`` | 60 | freeze the collector's objects this often, so a full collection walks only the newer ones (``runtime/gctune.py``; 0: CPython's own collector settings) |
| ``GPUJOB_GC_THAW_SECONDS`` | 1800 | thaw them and collect everything this often (one full pause) |
| ``GPUJOB_FAULT_EXIT_AT`` | unset | tests only: die at a named write boundary |
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from gpujob_operator import api
from gpujob_operator.api import hostports, podbytes
from gpujob_operator.lifecycle import backoff
from gpujob_operator.lifecycle.endpoints import PolicySettings
from gpujob_operator.lifecycle.planner import GANG_GRACE_SECONDS
from gpujob_operator.observability import opmetrics
from gpujob_operator.runtime import faults, gctune, peers

T = TypeVar("T")

DEFAULT_LIVENESS: Final = "http://0.0.0.0:8080/healthz"
MIN_TOKEN_KEY_BYTES: Final = 32
ENV_JOB_NETWORK_POLICY: Final = "GPUJOB_JOB_NETWORK_POLICY"
ENV_TOKEN_KEY_FILE: Final = "GPUJOB_ENDPOINT_TOKEN_KEY_FILE"


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
    max_job_pod_bytes: int = podbytes.DEFAULT_MAX_JOB_POD_BYTES
    """The most bytes of pods one job may ask for (``api/podbytes.py``; 0: no bound)."""
    scrape_cpu_cores: float = 1.0
    """The scrape CPU every job shares (``monitoring/scrape/budget.py``)."""
    api_timeout: float = 30.0
    watch_server_timeout: int = 300
    worker_limit: int = 200
    retry: backoff.Policy = backoff.RETRY
    restart_backoff: backoff.Policy = backoff.RESTART
    gang_grace_seconds: float = GANG_GRACE_SECONDS
    liveness: str | None = DEFAULT_LIVENESS
    """kopf's health endpoint; None (``GPUJOB_LIVENESS`` set empty): none."""
    metrics_port: int = opmetrics.DEFAULT_PORT
    metrics_addr: str = "0.0.0.0"
    fault_exit_at: str | None = None
    host_port_range: tuple[int, int] = hostports.RANGE
    """Node ports (half-open) a host-network job with ``hostNetworkPorts: Spec`` may have
    scraped (``GPUJOB_HOST_PORT_RANGE``, inclusive ``LOW-HIGH``): never a node daemon's."""
    gc_freeze_seconds: float = gctune.FREEZE_SECONDS
    """Seconds between freezes of the collector's objects; 0: the collector as CPython sets it."""
    gc_thaw_seconds: float = gctune.THAW_SECONDS
    """Seconds between thaws, each with one full collection."""
    forecast_interval: float = 30.0
    """Seconds between start-time forecasts of waiting jobs (``GPUJOB_FORECAST_INTERVAL``);
    0 turns forecasting off."""
    webhook_port: int = 0
    """The admission webhook's port; 0: no webhook."""
    webhook_addr: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_ca: str | None = None
    webhook_client_ca: str | None = None
    """The CA (PEM file) of the client certificate the API server presents to the webhook;
    set, a caller without one that it signed is refused in the TLS handshake."""
    job_network_policy: PolicySettings | None = None
    """A NetworkPolicy per job, letting only these peers reach its metrics ports; None: none."""
    endpoint_token_key: bytes | None = None
    """The key of the jobs' endpoint tokens; None: no tokens (``/debug/*`` open)."""
    webhook_register: str | None = None
    """Host mode: the name of a ValidatingWebhookConfiguration the operator registers for
    itself (URL ``https://127.0.0.1:<port>``) and deletes on exit; None: registered by the
    chart."""

    @property
    def webhook(self) -> bool:
        """Whether to serve the admission webhook (a port, a certificate and its key)."""
        return self.webhook_port > 0

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


def _seconds_or_zero(v: float) -> bool:
    return math.isfinite(v) and v >= 0


def _port_range(raw: str) -> tuple[int, int]:
    low, sep, high = raw.partition("-")
    if not sep:
        raise ValueError(raw)
    lo, hi = int(low), int(high)
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(raw)
    return lo, hi + 1


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(raw)
    return raw == "1"


def from_env(env: Mapping[str, str]) -> Settings:
    """Read every setting from ``env``; raise :class:`SettingsError` on the first bad one.

    The peering variables are read only when ``GPUJOB_PEERING`` turns peering on: a
    standalone replica never refuses to start over a variable it does not use. A backoff or
    the gang grace may be 0 (none); a timeout may not.
    """
    d = Settings()
    seconds, seconds_or_zero = "a number of seconds > 0", "a number of seconds >= 0"

    def policy(prefix: str, default: backoff.Policy) -> backoff.Policy:
        b = _read(
            env, f"{prefix}_BASE_SECONDS", default.base, float, seconds_or_zero, _seconds_or_zero
        )
        c = _read(
            env, f"{prefix}_MAX_SECONDS", default.cap, float, seconds_or_zero, _seconds_or_zero
        )
        if c < b:
            raise SettingsError(f"{prefix}_MAX_SECONDS={c:g} must be >= the base ({b:g})")
        return backoff.Policy(b, c, default.jitter)

    peering = env.get("GPUJOB_PEERING", "").strip()
    webhook_port = _read(
        env, "GPUJOB_WEBHOOK_PORT", d.webhook_port, int, "a port 0..65535 (0: off)",
        lambda v: 0 <= v <= 65535,
    )  # fmt: skip
    webhook_files = {
        name: env.get(f"GPUJOB_WEBHOOK_{name.upper()}", "").strip() or None
        for name in ("cert", "key", "ca", "client_ca")
    }
    check_webhook(webhook_port, webhook_files["cert"], webhook_files["key"])
    liveness = env.get("GPUJOB_LIVENESS", d.liveness or "").strip()
    return Settings(
        default_gang=_read(
            env,
            "GPUJOB_DEFAULT_GANG",
            d.default_gang,
            str,
            "one of " + ", ".join(api.GANGS),
            lambda v: v in api.GANGS,
        ),
        kueue=_read(env, "GPUJOB_KUEUE", d.kueue, _flag, "0 or 1"),
        peering=peering,
        peering_clusterwide=bool(peering)
        and _read(env, "GPUJOB_PEERING_CLUSTERWIDE", d.peering_clusterwide, _flag, "0 or 1"),
        peering_lifetime=_read(
            env,
            peers.ENV_LIFETIME,
            d.peering_lifetime,
            int,
            "whole seconds >= 10",
            lambda v: v >= 10,
        )
        if peering
        else d.peering_lifetime,
        pod_id=env.get("POD_ID") or None,
        scrape_concurrency=_read(
            env,
            "GPUJOB_SCRAPE_CONCURRENCY",
            d.scrape_concurrency,
            int,
            "an integer >= 1",
            lambda v: v >= 1,
        ),
        scrape_timeout=_read(
            env, "GPUJOB_SCRAPE_TIMEOUT", d.scrape_timeout, float, seconds, _positive_seconds
        ),
        max_job_pod_bytes=_read(
            env,
            "GPUJOB_MAX_JOB_POD_BYTES",
            d.max_job_pod_bytes,
            int,
            "a number of bytes >= 0 (0: no bound)",
            lambda v: v >= 0,
        ),
        scrape_cpu_cores=_read(
            env,
            "GPUJOB_SCRAPE_CPU_CORES",
            d.scrape_cpu_cores,
            float,
            "a number of cores > 0",
            _positive_seconds,
        ),
        api_timeout=_read(
            env, "GPUJOB_API_TIMEOUT", d.api_timeout, float, seconds, _positive_seconds
        ),
        watch_server_timeout=_read(
            env,
            "GPUJOB_WATCH_SERVER_TIMEOUT",
            d.watch_server_timeout,
            int,
            "whole seconds >= 1",
            lambda v: v >= 1,
        ),
        worker_limit=_read(
            env, "GPUJOB_WORKER_LIMIT", d.worker_limit, int, "an integer >= 1", lambda v: v >= 1
        ),
        retry=policy("GPUJOB_RETRY", d.retry),
        restart_backoff=policy("GPUJOB_RESTART_BACKOFF", d.restart_backoff),
        gang_grace_seconds=_read(
            env,
            "GPUJOB_GANG_GRACE_SECONDS",
            d.gang_grace_seconds,
            float,
            seconds_or_zero,
            _seconds_or_zero,
        ),
        liveness=liveness or None,
        gc_freeze_seconds=_read(
            env,
            "GPUJOB_GC_FREEZE_SECONDS",
            d.gc_freeze_seconds,
            float,
            "a number of seconds >= 0 (0: off)",
            _seconds_or_zero,
        ),
        gc_thaw_seconds=_read(
            env, "GPUJOB_GC_THAW_SECONDS", d.gc_thaw_seconds, float, seconds, _positive_seconds
        ),
        forecast_interval=_read(
            env,
            "GPUJOB_FORECAST_INTERVAL",
            d.forecast_interval,
            float,
            seconds_or_zero,
            _seconds_or_zero,
        ),
        metrics_port=_read(
            env,
            opmetrics.ENV_PORT,
            d.metrics_port,
            int,
            "a port 0..65535 (0: off)",
            lambda v: 0 <= v <= 65535,
        ),
        metrics_addr=env.get(opmetrics.ENV_ADDR, "").strip() or d.metrics_addr,
        webhook_port=webhook_port,
        webhook_addr=env.get("GPUJOB_WEBHOOK_ADDR", "").strip() or d.webhook_addr,
        webhook_cert=webhook_files["cert"],
        webhook_key=webhook_files["key"],
        webhook_ca=webhook_files["ca"],
        webhook_client_ca=webhook_files["client_ca"],
        webhook_register=env.get("GPUJOB_WEBHOOK_REGISTER", "").strip() or None,
        job_network_policy=_network_policy(env.get(ENV_JOB_NETWORK_POLICY, "").strip()),
        endpoint_token_key=_token_key(env.get(ENV_TOKEN_KEY_FILE, "").strip()),
        fault_exit_at=_read(
            env,
            faults.ENV,
            d.fault_exit_at,
            str,
            "one of " + ", ".join(faults.POINTS),
            lambda v: v in faults.POINTS,
        ),
        host_port_range=_read(
            env,
            "GPUJOB_HOST_PORT_RANGE",
            d.host_port_range,
            _port_range,
            "LOW-HIGH, two ports with 1024 <= LOW <= HIGH <= 65535",
        ),
    )


def check_webhook(port: int, cert: str | None, key: str | None) -> None:
    """A webhook port needs both certificate files: the API server only calls HTTPS."""
    if port and not (cert and key):
        raise SettingsError(
            f"GPUJOB_WEBHOOK_PORT={port}: needs GPUJOB_WEBHOOK_CERT and GPUJOB_WEBHOOK_KEY "
            "(PEM files of the webhook's serving certificate)"
        )


def _network_policy(raw: str) -> PolicySettings | None:
    """``GPUJOB_JOB_NETWORK_POLICY``: JSON from the chart (unset or empty: no policy)."""
    if not raw:
        return None
    must = 'JSON {"metricsFrom": [NetworkPolicyPeer objects], "otherPortsOpen": true|false}'
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    peers_ = doc.get("metricsFrom", []) if isinstance(doc, dict) else None
    open_ = doc.get("otherPortsOpen", False) if isinstance(doc, dict) else None
    if (
        not isinstance(peers_, list)
        or not all(isinstance(p, dict) and p for p in peers_)
        or not isinstance(open_, bool)
    ):
        raise SettingsError(f"{ENV_JOB_NETWORK_POLICY}={raw[:200]!r}: must be {must}")
    return PolicySettings(metrics_from=tuple(peers_), other_ports_open=open_)


def _token_key(path: str) -> bytes | None:
    """The token key from the file the chart mounts (unset: no tokens); refused when short."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise SettingsError(f"{ENV_TOKEN_KEY_FILE}={path!r}: cannot be read: {e}") from None
    if len(key) < MIN_TOKEN_KEY_BYTES:
        raise SettingsError(
            f"{ENV_TOKEN_KEY_FILE}={path!r}: the key must be at least {MIN_TOKEN_KEY_BYTES} bytes"
        )
    return key
