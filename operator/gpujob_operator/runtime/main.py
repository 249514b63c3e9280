"""Run the operator: ``gpujob operator [--namespace NS ...] [--liveness URL]``.

Start-up reads the settings once (:mod:`~gpujob_operator.runtime.settings`): a bad
``GPUJOB_*`` value ends the process here with one line naming it, before kopf starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from dataclasses import replace
from typing import Any, cast

from gpujob_operator.observability import opmetrics
from gpujob_operator.runtime import peers
from gpujob_operator.runtime.settings import (
    DEFAULT_LIVENESS,
    Settings,
    SettingsError,
    check_webhook,
    from_env,
)


def run(
    namespaces: list[str],
    liveness: str | None = None,
    verbose: bool = False,
    metrics_port: int | None = None,
    metrics_addr: str | None = None,
    webhook: dict[str, Any] | None = None,
) -> None:
    """Start kopf with the gpujob handlers, watching ``namespaces`` or the whole cluster.

    The flags, where given, win over their ``GPUJOB_*`` variables.
    """
    import kopf  # here, not at import: `gpujob diagnose` runs where kopf is not installed

    from gpujob_operator.runtime import handlers  # registers the handlers

    try:
        settings = from_env(os.environ)
    except SettingsError as e:
        sys.exit(f"gpujob operator: {e}")
    settings = _with_flags(settings, liveness, metrics_port, metrics_addr, **(webhook or {}))
    try:
        check_webhook(settings.webhook_port, settings.webhook_cert, settings.webhook_key)
    except SettingsError as e:
        sys.exit(f"gpujob operator: {e}")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not verbose:
        # kopf logs every handler success per event at INFO; the job loop logs what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    serve_metrics(settings.metrics_port, settings.metrics_addr)
    identity = peers.identity(settings.pod_id, socket.gethostname(), os.getpid())
    memo = handlers.install(settings, namespaces, identity)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=settings.standalone,
            liveness_endpoint=settings.liveness,
            identity=cast(Any, identity),
            memo=memo,  # the handlers' shared state (handlers.OperatorState)
        )
    )


def _with_flags(
    settings: Settings,
    liveness: str | None,
    metrics_port: int | None,
    metrics_addr: str | None,
    **more: Any,
) -> Settings:
    """The settings with the command line's values where it gave any."""
    flags = {
        "liveness": liveness,
        "metrics_port": metrics_port,
        "metrics_addr": metrics_addr,
        **more,
    }
    given: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    return replace(settings, **given)


def serve_metrics(port: int, addr: str) -> None:
    """Serve the operator's /metrics; 0 turns it off. A busy port is logged, not fatal:
    reconciling matters more than metrics, and the OperatorDown alert shows the gap."""
    if port == 0:
        return
    try:
        opmetrics.METRICS.serve(port, addr)
    except OSError as e:
        logging.getLogger("gpujob.main").error("cannot serve metrics on %s:%d: %s", addr, port, e)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only these namespaces (repeatable); default: the whole cluster",
    )
    p.add_argument(
        "--liveness",
        default=None,
        help=f"kopf's health endpoint (default: env GPUJOB_LIVENESS, else {DEFAULT_LIVENESS}; "
        "empty: none)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=f"port of the operator's /metrics (0: off; default: env {opmetrics.ENV_PORT}, "
        f"else {Settings.metrics_port})",
    )
    p.add_argument(
        "--metrics-addr",
        default=None,
        help=f"address /metrics binds (default: env {opmetrics.ENV_ADDR}, else "
        f"{Settings.metrics_addr})",
    )
    p.add_argument(
        "--webhook-port",
        type=int,
        default=None,
        help="serve the admission webhook on this port (HTTPS; 0: off; default: env "
        "GPUJOB_WEBHOOK_PORT, else off); needs --webhook-cert and --webhook-key",
    )
    p.add_argument("--webhook-cert", default=None, help="the webhook's serving certificate (PEM)")
    p.add_argument("--webhook-key", default=None, help="its private key (PEM)")
    p.add_argument("--webhook-ca", default=None, help="the CA that signed it (PEM)")
    p.add_argument(
        "--webhook-client-ca",
        default=None,
        help="answer only callers with a client certificate this CA signed (PEM): the API "
        "server's, given to it by an AdmissionConfiguration (default: env "
        "GPUJOB_WEBHOOK_CLIENT_CA, else any caller)",
    )
    p.add_argument(
        "--webhook-register",
        default=None,
        help="host mode: register a ValidatingWebhookConfiguration of this name pointing at "
        "https://127.0.0.1:PORT, deleted on exit (the chart registers its own)",
    )
    p.add_argument("--verbose", "-v", action="store_true")


def webhook_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The webhook's command-line values, keyed by their settings' names."""
    names = ("port", "cert", "key", "ca", "client_ca", "register")
    return {f"webhook_{n}": getattr(args, f"webhook_{n}", None) for n in names}
