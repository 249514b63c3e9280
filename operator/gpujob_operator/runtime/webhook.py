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
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
import aiohttp.web
import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api import podbytes
from gpujob_operator.lifecycle.apiserver import admissionreview, podreview, refusals
from gpujob_operator.runtime.kube import Kube, in_api_thread
from gpujob_operator.runtime.settings import Settings

log = logging.getLogger("gpujob.webhook")


MAX_CONCURRENT_DRY_RUNS: Final = 4
"""Dry runs in flight at once, in the webhook's own threads: a burst of applies against a
slow API server queues here (and is admitted with a warning past the budget) instead of
taking the threads the job loops' API calls run in."""
PER_SOURCE_DRY_RUNS: Final = MAX_CONCURRENT_DRY_RUNS // 2
"""Dry runs one client address may hold at once: a caller that floods the port (a pod that
can reach it) leaves half the slots to every other address, the API server's included.
Its further reviews wait for its own slots within the same deadline as any review."""
MAX_REVIEWS_IN_FLIGHT: Final = 16
"""Reviews being read, decoded or judged at once, from every client; past it a review is
answered at once, unchecked. With :data:`admissionreview.MAX_REVIEW_BYTES` each, the bodies
held stay under 80 MiB."""
PARSE_OFF_LOOP_BYTES: Final = 64 * 1024
"""A review larger than this is decoded in the webhook's parser thread, not on the event
loop (the job loops share it)."""


class SourceSlots:
    """A semaphore per client address, created on first use and dropped when idle."""

    def __init__(self, per_source: int) -> None:
        self.per_source = per_source
        self.slots: dict[str, asyncio.Semaphore] = {}
        self.users: dict[str, int] = {}

    async def acquire(self, source: str, timeout: float) -> bool:
        """Take one of ``source``'s slots within ``timeout``; False when none came free."""
        slot = self.slots.setdefault(source, asyncio.Semaphore(self.per_source))
        self.users[source] = self.users.get(source, 0) + 1
        try:
            await asyncio.wait_for(slot.acquire(), timeout)
            return True
        except BaseException as e:  # a timeout, or the review cancelled: nothing held
            self._leave(source)
            if isinstance(e, TimeoutError):
                return False
            raise

    def release(self, source: str) -> None:
        self.slots[source].release()
        self._leave(source)

    def _leave(self, source: str) -> None:
        self.users[source] -= 1
        if not self.users[source]:
            del self.users[source], self.slots[source]


class Reviewer:
    """Reviews admission requests; at most :data:`MAX_CONCURRENT_DRY_RUNS` dry runs at once,
    :data:`PER_SOURCE_DRY_RUNS` of them for one client address."""

    def __init__(
        self,
        kube: Callable[[], Kube],
        timeout: float = podreview.DRY_RUN_TIMEOUT,
        max_pod_bytes: int = podbytes.DEFAULT_MAX_JOB_POD_BYTES,
    ):
        self.kube = kube
        self.timeout = timeout
        self.max_pod_bytes = max_pod_bytes
        """The most bytes of pods one job may ask for (``api/podbytes.py``; 0: no bound)."""
        self.slots = asyncio.Semaphore(MAX_CONCURRENT_DRY_RUNS)
        self.sources = SourceSlots(PER_SOURCE_DRY_RUNS)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            MAX_CONCURRENT_DRY_RUNS, thread_name_prefix="gpujob-webhook"
        )
        self.parser = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="gpujob-webhook-parse"
        )
        """One thread decodes large reviews and builds their pods, one at a time: the peak
        memory of a decode is bounded by one body, and the event loop stays free."""

    async def review(
        self, job: Mapping[str, Any], old: Mapping[str, Any] | None = None, source: str = ""
    ) -> podreview.Verdict:
        """The verdict on a job as submitted (its raw object, CRD defaults applied); on an
        update (``old``), pods the change leaves as they were are not judged again: a
        namespace's policy tightened since would otherwise block a suspend or a TTL edit."""
        loop = asyncio.get_running_loop()
        too_large, pods, unchanged = await loop.run_in_executor(
            self.parser, _screen, job, old, self.max_pod_bytes
        )
        if too_large is not None:
            return podreview.Verdict(False, f"{c.PODS_TOO_LARGE}: {too_large}")
        if pods is None or unchanged:
            return podreview.ALLOW  # the CRD's own checks answer for the spec's fields
        raw_spec = job["spec"]
        namespace = str((job.get("metadata") or {}).get("namespace") or "default")
        verdicts = await asyncio.gather(
            *(self._dry_run(namespace, p, raw_spec, source) for p in pods)
        )
        return podreview.merge(verdicts)

    async def _dry_run(
        self, namespace: str, pod: dict[str, Any], raw_spec: Mapping[str, Any], source: str
    ) -> podreview.Verdict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        busy = refusals.Refusal(
            c.API_UNREACHABLE, False, f"too many reviews in flight for {self.timeout:g}s"
        )
        if not await self.sources.acquire(source, self.timeout):
            return podreview.judge(busy, {}, raw_spec, pod)
        try:
            try:
                await asyncio.wait_for(self.slots.acquire(), max(deadline - loop.time(), 0.01))
            except TimeoutError:
                return podreview.judge(busy, {}, raw_spec, pod)
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
        finally:
            self.sources.release(source)


def _too_large(job: Mapping[str, Any], old: Mapping[str, Any] | None, bound: int) -> str | None:
    """Why the job's pods are too many bytes for the operator; an update that leaves the
    template and the width as they were is not judged again (a bound lowered since must
    not block a suspend or a TTL edit)."""
    spec = job.get("spec")
    if not isinstance(spec, Mapping):
        return None
    before = (old or {}).get("spec")
    if isinstance(before, Mapping) and all(
        spec.get(k) == before.get(k) for k in ("template", "nodes")
    ):
        return None
    return podbytes.refusal(spec, bound)


def _screen(
    job: Mapping[str, Any], old: Mapping[str, Any] | None, bound: int
) -> tuple[str | None, list[dict[str, Any]] | None, bool]:
    """One trip to the parse thread: why the job's pods are too large (then no pod is
    built), else its dry-run pods and whether an update left them as they were."""
    too_large = _too_large(job, old, bound)
    if too_large is not None:
        return too_large, None, False
    return (None, *_pods_and_unchanged(job, old))


def _pods_and_unchanged(
    job: Mapping[str, Any], old: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]] | None, bool]:
    """The job's dry-run pods, and whether an update left them as they were."""
    pods = _pods(job)
    return pods, pods is not None and old is not None and _pods(old) == pods


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
    """Serve the webhook once kopf starts; called only when the webhook is enabled.

    No ``kopf.on.validate`` handler: the server answers reviews itself
    (:class:`GuardedServer`), so a review never reaches kopf's admission engine, which keeps
    one memory for every object uid an UPDATE review names, for ever, real or not.
    """
    own = settings
    reviewer = Reviewer(kube, max_pod_bytes=settings.max_job_pod_bytes)

    @kopf.on.startup()
    def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.managed = None  # the chart's, or ours below: scoped and bounded
        settings.admission.server = server(own, namespaces, kube, reviewer)

    @kopf.on.cleanup()
    async def unregister_webhook(**_: Any) -> None:
        if own.webhook_register:
            await in_api_thread(unregister, kube(), own.webhook_register)


async def answer(
    reviewer: Reviewer, review: Any, namespaces: Sequence[str], source: str = ""
) -> dict[str, Any]:
    """The reply to one parsed review: a dry run of the job's pods where the API server
    could have sent it, else an immediate, unchecked admission. Never raises: a review is
    untrusted input, and whatever it holds is answered."""
    try:
        screened = admissionreview.screen(review, namespaces)
        if isinstance(screened, admissionreview.Skipped):
            log.info("admission review %r answered unchecked: %s", screened.uid, screened.why)
            return admissionreview.response(
                screened.uid,
                True,
                warnings=[f"gpujob did not check this request: {screened.why}"],
            )
        job, old = dict(screened.job), screened.old
        if old is not None and old.get("spec") == job.get("spec"):
            return admissionreview.response(screened.uid, True)  # the matchCondition skips these
    except Exception as e:  # RecursionError on a crafted nesting, or a bug
        log.warning("admission review answered unchecked: %s", type(e).__name__)
        return admissionreview.response(
            "", True, warnings=["gpujob did not check this request: it could not be read"]
        )
    try:
        verdict = await reviewer.review(job, old, source)
    except Exception as e:
        log.exception("admission review of %s failed; admitted", _name(job))
        return admissionreview.response(
            screened.uid,
            True,
            warnings=[f"the job's pods could not be checked ({type(e).__name__})"],
        )
    return admissionreview.response(
        screened.uid, verdict.allowed, verdict.message, verdict.code, verdict.warnings
    )


def server(
    settings: Settings,
    namespaces: list[str],
    kube: Callable[[], Kube],
    reviewer: Reviewer | None = None,
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
    if settings.webhook_client_ca:
        # Only the API server holds a certificate this CA signed: every other caller is
        # refused before a byte of a review is read.
        options["verify_mode"] = ssl.CERT_REQUIRED
        options["verify_cafile"] = settings.webhook_client_ca
    reviewer = reviewer or Reviewer(kube, max_pod_bytes=settings.max_job_pod_bytes)
    if not settings.webhook_register:
        return GuardedServer(reviewer, namespaces, **options)
    return _RegisteringServer(settings.webhook_register, reviewer, namespaces, kube, **options)


class GuardedServer(kopf.WebhookServer):
    """kopf's HTTPS server (certificates, their renewal), answering reviews itself: bounded
    in bytes, in reviews in flight, in dry runs per client address, and dry-running only
    what the API server could have sent (:func:`admissionreview.screen`)."""

    def __init__(self, reviewer: Reviewer, namespaces: Sequence[str], **options: Any) -> None:
        super().__init__(**options)
        self.reviewer = reviewer
        self.namespaces = list(namespaces)
        self.in_flight = 0

    async def _serve(  # type: ignore[override]
        self, fn: Any, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        """One review; ``fn`` (kopf's admission engine) is never called."""
        source = request.remote or ""
        if self.in_flight >= MAX_REVIEWS_IN_FLIGHT:
            prefix = await request.content.read(admissionreview.UID_SCAN_BYTES)
            log.warning("admission review from %s answered unchecked: too many in flight", source)
            return aiohttp.web.json_response(
                admissionreview.response(
                    admissionreview.uid_of_prefix(prefix),
                    True,
                    warnings=["gpujob did not check this job's pods: too many reviews in flight"],
                )
            )
        self.in_flight += 1
        try:
            return aiohttp.web.json_response(await self._answer(request, source))
        finally:
            self.in_flight -= 1

    async def _answer(self, request: aiohttp.web.Request, source: str) -> dict[str, Any]:
        raw = await read_bounded(request.content, admissionreview.MAX_REVIEW_BYTES)
        if len(raw) > admissionreview.MAX_REVIEW_BYTES:
            uid = admissionreview.uid_of_prefix(raw[: admissionreview.UID_SCAN_BYTES])
            log.warning("admission review %r refused: over the bound", uid)
            return admissionreview.too_large(uid)
        try:
            if len(raw) > PARSE_OFF_LOOP_BYTES:
                loop = asyncio.get_running_loop()
                review = await loop.run_in_executor(self.reviewer.parser, json.loads, raw)
            else:
                review = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            review = None
        del raw
        return await answer(self.reviewer, review, self.namespaces, source)


async def read_bounded(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of a body: one byte more than the bound says it is over."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await stream.read(min(64 * 1024, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class _RegisteringServer(GuardedServer):
    """Host mode: once kopf's server listens, point a configuration of our own at it."""

    def __init__(
        self,
        name: str,
        reviewer: Reviewer,
        namespaces: list[str],
        kube: Callable[[], Kube],
        **options: Any,
    ) -> None:
        super().__init__(reviewer, namespaces, **options)
        self.config_name = name
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
                await in_api_thread(register, self.kube(), body)
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
