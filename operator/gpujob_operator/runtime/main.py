"""Run the operator: ``gpujob operator [--namespace NS ...] [--liveness URL]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any, cast

from gpujob_operator.observability import opmetrics


def run(
    namespaces: list[str],
    liveness: str | None,
    verbose: bool = False,
    metrics_port: int = opmetrics.DEFAULT_PORT,
    metrics_addr: str = "0.0.0.0",
) -> None:
    """Start kopf with the gpujob handlers, watching ``namespaces`` or the whole cluster."""
    import kopf  # here, not at import: `gpujob diagnose` runs where kopf is not installed

    from gpujob_operator.runtime import handlers  # registers the handlers

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not verbose:
        # kopf logs every handler success per event at INFO; the reconciler logs what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    serve_metrics(metrics_port, metrics_addr)
    handlers.NAMESPACES[:] = namespaces
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=os.environ.get("GPUJOB_PEERING", "") == "",
            liveness_endpoint=liveness,
            identity=cast(Any, handlers.IDENTITY),
        )
    )


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
        default=os.environ.get("GPUJOB_LIVENESS", "http://0.0.0.0:8080/healthz"),
        help="kopf's health endpoint",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get(opmetrics.ENV_PORT, opmetrics.DEFAULT_PORT)),
        help=f"port of the operator's /metrics (0: off; env {opmetrics.ENV_PORT})",
    )
    p.add_argument(
        "--metrics-addr",
        default=os.environ.get(opmetrics.ENV_ADDR, "0.0.0.0"),
        help=f"address /metrics binds (env {opmetrics.ENV_ADDR})",
    )
    p.add_argument("--verbose", "-v", action="store_true")
