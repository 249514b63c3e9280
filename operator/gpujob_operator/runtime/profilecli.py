"""``gpujob profile NAME``: ask a running job for a profile, and with ``--wait`` its answer.

The request is checked here with the operator's own parser and decision
(:mod:`gpujob_operator.api.profile`) before anything is written: a bad request is refused
before any API call (exit 2, the reason printed), and one the job cannot take (finished,
not running, unknown ranks, a capture under way) after reading the job but before the
annotation is set. Then the annotation ``gpujob.dev/profile`` is set with a fresh id; with
``--wait`` ``status.profile`` is polled until the operator says Captured, Failed or Refused
for that id (or the deadline), and the answer and the per-rank table (the ConfigMap's
``summary``) are printed.

Exit codes: 0 asked (or Captured), 1 Failed or the job not found, 2 refused, 124 no answer
by the deadline. The API calls sit behind :class:`JobApi`, so tests inject them.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

from gpujob_operator.api import conditions as c
from gpujob_operator.api import profile as P
from gpujob_operator.api.job import GROUP, PLURAL, VERSION
from gpujob_operator.api.names import PROFILE_ANNOTATION
from gpujob_trainer import contract

EXIT_REFUSED = 2
EXIT_FAILED = 1
EXIT_TIMEOUT = 124


class JobApi(Protocol):
    """The three calls the command makes (the Kubernetes API, or a test's fake)."""

    def get_job(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def annotate(
        self, namespace: str, name: str, key: str, value: str, resource_version: str | None = None
    ) -> bool | None:
        """Set the annotation; with ``resource_version``, only on that version of the job
        (False: the job changed meanwhile)."""
        ...

    def configmap_data(self, namespace: str, name: str) -> Mapping[str, str] | None: ...


class KubeJobApi:
    """:class:`JobApi` through the kubernetes client (kubeconfig, or in-cluster)."""

    def __init__(self) -> None:
        from kubernetes import client

        from gpujob_operator.runtime.kube import load_client

        api = load_client()
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    def get_job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return job if isinstance(job, Mapping) else None

    def annotate(
        self, namespace: str, name: str, key: str, value: str, resource_version: str | None = None
    ) -> bool | None:
        from kubernetes.client.exceptions import ApiException

        meta: dict[str, Any] = {"annotations": {key: value}}
        if resource_version:
            meta["resourceVersion"] = resource_version  # the API server answers 409 if stale
        try:
            self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": meta}
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def configmap_data(self, namespace: str, name: str) -> Mapping[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self._core.read_namespaced_config_map(name, namespace)
        except ApiException:
            return None
        return dict(cm.data or {})


ANNOTATE_TRIES = 10
"""Tries to set the request on the version of the job it was checked against."""


def default_namespace() -> str:
    """The kubeconfig's current context's namespace, else ``default``."""
    try:
        from kubernetes import config

        _, current = config.list_kube_config_contexts()
        return str((current or {}).get("context", {}).get("namespace") or "default")
    except Exception:
        return "default"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the GPUTrainingJob")
    p.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig's)")
    p.add_argument(
        "--steps",
        type=int,
        default=contract.PROFILE_DEFAULT_STEPS,
        help=f"training steps to profile, 1..{contract.PROFILE_MAX_STEPS} "
        f"(default {contract.PROFILE_DEFAULT_STEPS})",
    )
    p.add_argument(
        "--ranks",
        default="slowest",
        help="all, slowest (the verdict's slowest and median ranks; default) or a list: 0,13",
    )
    p.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds"
    )
    p.add_argument("--poll", type=float, default=2.0, metavar="S", help=argparse.SUPPRESS)


def _now() -> str:
    return c.format_time(datetime.now(UTC))


def _outcome(profile: Mapping[str, Any], capture_id: str) -> tuple[str, Mapping[str, Any]] | None:
    """(state, record) once the status says how capture ``capture_id`` ended."""
    refused = profile.get("refused") or {}
    if refused.get("id") == capture_id:
        return "Refused", refused
    if profile.get("id") == capture_id and profile.get("state") in P.DONE:
        return str(profile["state"]), profile
    return None


def render_record(record: Mapping[str, Any], table: str | None, out: TextIO) -> None:
    """The answer, where the traces are, and the per-rank table."""
    out.write(f"{record.get('answer') or record.get('reason') or ''}\n")
    if record.get("path"):
        out.write(f"traces: {record['path']} in the pods (ranks {record.get('ranks')})\n")
    if record.get("configMap"):
        out.write(f"configmap: {record['configMap']}\n")
    for f in record.get("failedRanks") or ():
        out.write(f"rank {f.get('rank')}: {f.get('why')}\n")
    if table:
        lines = table.splitlines()
        if lines and lines[0] == record.get("answer"):
            lines = lines[1:]
        out.write("\n".join(lines).rstrip("\n") + "\n")


def run(
    args: argparse.Namespace,
    api: JobApi | None = None,
    *,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    new_id: Callable[[], str] = lambda: secrets.token_hex(4),
) -> int:
    """Entry point of ``gpujob profile``."""
    capture_id = new_id()
    value = P.format_request(args.steps, args.ranks, capture_id)
    parsed = P.parse_request(value)
    if isinstance(parsed, str):
        err.write(f"gpujob profile: refused: {parsed}\n")
        return EXIT_REFUSED
    api = api if api is not None else KubeJobApi()
    namespace = args.namespace or default_namespace()
    for _ in range(ANNOTATE_TRIES):  # the job's version moves with every status write
        job = api.get_job(namespace, args.name)
        if job is None:
            err.write(f"gpujob profile: job {namespace}/{args.name} not found\n")
            return EXIT_FAILED
        waiting = P.waiting_request(job)
        if waiting is not None:
            err.write(
                f"gpujob profile: refused: another request ({waiting}) waits for the operator; "
                "ask again once status.profile shows it\n"
            )
            return EXIT_REFUSED
        meta = dict(job.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), PROFILE_ANNOTATION: value}
        decision = P.decide({**job, "metadata": meta}, _now())
        if isinstance(decision, P.Refuse):
            err.write(f"gpujob profile: refused: {decision.reason}\n")
            return EXIT_REFUSED
        version = str(meta.get("resourceVersion") or "") or None
        if api.annotate(namespace, args.name, PROFILE_ANNOTATION, value, version) is not False:
            break
    else:
        err.write(f"gpujob profile: the job kept changing; try again (id {capture_id})\n")
        return EXIT_FAILED
    out.write(f"asked {namespace}/{args.name} for a profile: {value}\n")
    if not args.wait:
        return 0
    step = P.step_seconds(job.get("status") or {})
    limit = args.timeout if args.timeout is not None else P.wait_seconds(args.steps, step) + 60
    until = clock() + limit
    while True:
        job = api.get_job(namespace, args.name)
        if job is None:
            err.write(f"gpujob profile: job {namespace}/{args.name} is gone\n")
            return EXIT_FAILED
        found = _outcome((job.get("status") or {}).get("profile") or {}, capture_id)
        if found is not None:
            state, record = found
            if state == "Refused":
                err.write(f"gpujob profile: refused: {record.get('reason')}\n")
                return EXIT_REFUSED
            cm = record.get("configMap")
            data = api.configmap_data(namespace, str(cm)) if cm else None
            render_record(record, (data or {}).get("summary"), out)
            return 0 if state == "Captured" else EXIT_FAILED
        if clock() >= until:
            err.write(f"gpujob profile: no answer within {limit:.0f}s (id {capture_id})\n")
            return EXIT_TIMEOUT
        sleep(max(0.0, min(args.poll, until - clock())))
