"""Run the operator: ``gpujob operator [--namespace NS ...] [--liveness URL]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf


def run(namespaces: list[str], liveness: str | None, verbose: bool = False) -> None:
    """Start kopf with the gpujob handlers, watching ``namespaces`` or the whole cluster."""
    from gpujob_operator import handlers  # noqa: F401 - registers the handlers

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=os.environ.get("GPUJOB_PEERING", "") == "",
            liveness_endpoint=liveness,
        )
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only these namespaces (repeatable); default: the whole cluster")  # fmt: skip
    p.add_argument("--liveness", default=os.environ.get("GPUJOB_LIVENESS", "http://0.0.0.0:8080/healthz"),
                   help="kopf's health endpoint")  # fmt: skip
    p.add_argument("--verbose", "-v", action="store_true")
