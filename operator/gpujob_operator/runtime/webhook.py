"""The validating admission webhook: a job's pods dry-run against the API server at apply.

kopf serves it (``kopf.on.validate`` on the operator's event loop, ``kopf.WebhookServer``
with the certificate files it is given); the decisions are pure
(:mod:`~gpujob_operator.lifecycle.apiserver.podreview`). Each review builds rank 0 (and the last
rank) with the operator's own builder and dry-runs them through the operator's API client,
bounded by :data:`~gpujob_operator.lifecycle.apiserver.podreview.DRY_RUN_TIMEOUT`; the calls run in
worker threads, so a slow API server never holds the job loops up.

The webhook never denies for a reason of its own: an error here, a timeout or an API
server that cannot answer now admits the job with a warning (the operator's run-time
checks still apply). Only core/v1's refusal of the pod as built denies it.

Registration: the chart installs a ValidatingWebhookConfiguration that points at the
operator's Service. In host mode (``GPUJOB_WEBHOOK_REGISTER``: tests, development) the
operator registers one of its own at ``https://127.0.0.1:<port>``, scoped to the namespaces
it watches, once its server listens, and deletes it on a graceful exit.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final, cast

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle.apiserver import podreview, refusals
from gpujob_operator.runtime.kube import Kube
from gpujob_operator.runtime.settings import Settings

log = logging.getLogger("gpujob.webhook")


MAX_CONCURRENT_DRY_RUNS: Final = 4
"""Dry runs in flight at once, in the webhook's own threads: a burst of applies against a
slow API server queues here (and is admitted with a warning past the budget) instead of
taking the threads the job loops' API calls run in."""


class Reviewer:
    """Reviews admission requests; at most :data:`MAX_CONCURRENT_DRY_RUNS` dry runs at once."""

    def __init__(self, kube: Callable[[], Kube], timeout: float = podreview.DRY_RUN_TIMEOUT):
        self.kube = kube
        self.timeout = timeout
        self.slots = asyncio.Semaphore(MAX_CONCURRENT_DRY_RUNS)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            MAX_CONCURRENT_DRY_RUNS, thread_name_prefix="gpujob-webhook"
        )

    async def review(
        self, job: Mapping[str, Any], old: Mapping[str, Any] | None = None
    ) -> podreview.Verdict:
        """The verdict on a job as submitted (its raw object, CRD defaults applied); on an
        update (``old``), pods the change leaves as they were are not judged again: a
        namespace's policy tightened since would otherwise block a suspend or a TTL edit."""
        pods = _pods(job)
        if pods is None:
            return podreview.ALLOW  # the CRD's own checks answer for the spec's fields
        if old is not None and _pods(old) == pods:
            return podreview.ALLOW
        raw_spec = job["spec"]
        namespace = str((job.get("metadata") or {}).get("namespace") or "default")
        verdicts = await asyncio.gather(*(self._dry_run(namespace, p, raw_spec) for p in pods))
        return podreview.merge(verdicts)

    async def _dry_run(
        self, namespace: str, pod: dict[str, Any], raw_spec: Mapping[str, Any]
    ) -> podreview.Verdict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            await asyncio.wait_for(self.slots.acquire(), self.timeout)
        except TimeoutError:
            refusal = refusals.Refusal(
                c.API_UNREACHABLE, False, f"too many reviews in flight for {self.timeout:g}s"
            )
            return podreview.judge(refusal, {}, raw_spec, pod)
        try:
            left = max(deadline - loop.time(), 0.1)
            await self.kube().dry_run_pod(namespace, pod, left, self.executor)
            return podreview.ALLOW
        except TimeoutError:
            refusal = refusals.Refusal(
                c.API_UNREACHABLE, False, f"no answer to the dry run in {self.timeout:g}s"
            )
            return podreview.judge(refusal, {}, raw_spec, pod)
        except Exception as e:  # classified: a refusal, no answer, or a bug (warned)
            refusal = refusals.classify_exception(e)
            body = getattr(e, "body", None) if isinstance(e, ApiException) else None
            return podreview.judge(refusal, refusals.status_body(body), raw_spec, pod)
        finally:
            self.slots.release()


def _pods(job: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The dry-run pods of a job as submitted, None when its spec does not parse."""
    raw_spec = job.get("spec")
    if not isinstance(raw_spec, Mapping):
        return None
    try:
        spec = api.parse_spec(raw_spec)
    except ValidationError:
        return None
    return podreview.review_pods(job, spec)


def install(settings: Settings, namespaces: list[str], kube: Callable[[], Kube]) -> None:
    """Register the webhook's kopf handlers; called only when the webhook is enabled (kopf
    refuses to start with an admission handler and no server)."""
    own = settings
    reviewer = Reviewer(kube)

    async def review_job(
        body: kopf.Body,
        old: kopf.Body | None,
        operation: str | None,
        warnings: list[str],
        **_: Any,
    ) -> None:
        """Deny a job whose pods core/v1 refuses; admit anything else (warned if unchecked)."""
        job = dict(body)
        if operation == "UPDATE" and old is not None and dict(old).get("spec") == job.get("spec"):
            return  # the matchCondition skips these; a registration without one may not
        try:
            verdict = await reviewer.review(
                job, dict(old) if operation == "UPDATE" and old else None
            )
        except Exception as e:
            log.exception("admission review of %s failed; admitted", _name(job))
            warnings.append(f"the job's pods could not be checked ({type(e).__name__}: {e})")
            return
        warnings.extend(verdict.warnings)
        if not verdict.allowed:
            raise kopf.AdmissionError(verdict.message, code=verdict.code)

    kopf.on.validate(
        api.GROUP,
        api.VERSION,
        api.PLURAL,
        id=podreview.WEBHOOK_PATH,
        operations=["CREATE", "UPDATE"],
    )(review_job)  # type: ignore[arg-type]

    @kopf.on.startup()
    def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.managed = None  # the chart's, or ours below: scoped and bounded
        settings.admission.server = server(own, namespaces, kube)

    @kopf.on.cleanup()
    async def unregister_webhook(**_: Any) -> None:
        if own.webhook_register:
            await asyncio.to_thread(unregister, kube(), own.webhook_register)


def server(
    settings: Settings, namespaces: list[str], kube: Callable[[], Kube]
) -> kopf.WebhookServer:
    """kopf's HTTPS server with the given certificate; registering itself in host mode."""
    options: dict[str, Any] = {
        "addr": settings.webhook_addr,
        "port": settings.webhook_port,
        "certfile": settings.webhook_cert,
        "pkeyfile": settings.webhook_key,
        "cafile": settings.webhook_ca,
        "file_check_interval": 60.0,  # a renewed Secret is picked up without a restart
    }
    if not settings.webhook_register:
        return kopf.WebhookServer(**options)
    return _RegisteringServer(settings.webhook_register, namespaces, kube, **options)


class _RegisteringServer(kopf.WebhookServer):
    """Host mode: once kopf's server listens, point a configuration of our own at it."""

    def __init__(
        self, name: str, namespaces: list[str], kube: Callable[[], Kube], **options: Any
    ) -> None:
        super().__init__(**options)
        self.config_name = name
        self.namespaces = namespaces
        self.kube = kube
        self._registration: asyncio.Task[None] | None = None

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(fn):
            url = f"{str(client_config['url']).rstrip('/')}/{podreview.WEBHOOK_PATH}"
            ca = client_config.get("caBundle") or _ca_bundle(self.cafile)
            body = podreview.webhook_configuration(
                self.config_name, {"url": url, "caBundle": ca}, self.namespaces
            )
            self._registration = asyncio.create_task(self._register(body, url))
            yield client_config

    async def _register(self, body: dict[str, Any], url: str) -> None:
        """Register, retrying with backoff: a refusal (RBAC, a 5xx) must not stop kopf's
        server task, which would stop the operator."""
        delay = 1.0
        while True:
            try:
                await asyncio.to_thread(register, self.kube(), body)
                log.info("webhook %s registered at %s", self.config_name, url)
                return
            except Exception as e:  # logged and retried: the operator keeps running
                log.warning(
                    "webhook %s could not be registered (%s); retry in %.0fs "
                    "(it needs get/create/update/delete on validatingwebhookconfigurations)",
                    self.config_name,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)


def _ca_bundle(path: Any) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode("ascii") if path else ""


def register(kube: Kube, body: dict[str, Any]) -> None:
    """Create the ValidatingWebhookConfiguration, or replace the one of that name."""
    admission = client.AdmissionregistrationV1Api(kube.api_client)
    name = body["metadata"]["name"]
    try:
        admission.create_validating_webhook_configuration(cast(Any, body))
    except ApiException as e:
        if e.status != 409:
            raise
        current: Any = admission.read_validating_webhook_configuration(name)
        body = {**body, "metadata": {**body["metadata"]}}
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        admission.replace_validating_webhook_configuration(name, cast(Any, body))


def unregister(kube: Kube, name: str) -> None:
    """Delete our own configuration (a 404 is fine: gone already)."""
    try:
        client.AdmissionregistrationV1Api(kube.api_client).delete_validating_webhook_configuration(
            name
        )
        log.info("webhook %s unregistered", name)
    except ApiException as e:
        if e.status != 404:
            log.warning("webhook %s could not be unregistered: %s", name, e.reason)


def _name(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
