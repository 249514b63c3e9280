"""Per-job monitoring glue (pure): scrape results in; status parts, conditions, Events out.

The shell (the per-job reconcile loop) owns one `JobMonitor` per job and, every scrape
interval, does::

    targets = monitor.scrape_targets(spec, pods)          # or scrape_targets(spec, pods)
    results = await scraper.scrape_all(targets)           # scraper.Scraper, shared by all jobs
    update = monitor.observe(results, time.time())
    for event in update.events: post(event)
    patch = update.status_patch(current_status)           # None: nothing worth writing
    if patch: patch_status(patch)

`status_patch` (see `update`) returns a JSON merge patch only when something changed
meaningfully (or the last write is older than `refresh_seconds`), so a thousand jobs do not
flood the API server with a write per job per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import LABEL_NODE_RANK, controller_uid, owned
from gpujob_operator.api.display import format_hang
from gpujob_operator.api.events import Event
from gpujob_operator.api.hostports import RANGE as HOST_RANGE
from gpujob_operator.api.hostports import metrics_port_rank, scrape_port
from gpujob_operator.monitoring.scrape import guard
from gpujob_operator.monitoring.scrape.budget import Stretch
from gpujob_operator.monitoring.scrape.frame import frame
from gpujob_operator.monitoring.scrape.result import (
    ENDPOINT_TEXT_MAX,
    ErrorKind,
    ScrapeResult,
    ScrapeTarget,
)
from gpujob_operator.monitoring.update import REFRESH_SECONDS, MonitorUpdate, PatchClock
from gpujob_operator.monitoring.verdicts import hysteresis
from gpujob_operator.monitoring.verdicts.analysis import Analysis, analyze
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.progress import ProgressMemory
from gpujob_operator.monitoring.verdicts.verdict import (
    CRITICAL,
    HARDWARE_FAULT,
    HEALTHY,
    INFO,
    STALLED,
    WARNING,
)
from gpujob_operator.monitoring.window import MAX_SERIES, Window
from gpujob_trainer import contract

MAX_FAILURES_LISTED: Final = 5
MAX_NOTES_LISTED: Final = 3
MAX_FAILURE_TEXT: Final = 2 * ENDPOINT_TEXT_MAX
"""Characters of one failure's or note's words in MetricsAvailable: the scraper's sentence with
an endpoint's clipped words in it, clipped once more here where every one of them passes, so
no endpoint can push the message past the CRD's limit (`conditions.MESSAGE_MAX_LENGTH`)."""
STARTUP_GRACE: Final = 180.0
NEARLY_DONE_SECONDS: Final = 30.0
"""Seconds after the first scrape of an attempt during which refused endpoints mean "starting"."""
STALL_CONFIRM_SCRAPES: Final = 2
"""Consecutive scrapes that must find the job Stalled before the condition's reason becomes
StallConfirmed, the only one runPolicy.restartOnStall acts on (one odd scrape kills no gang)."""
_DOWN: Final = frozenset({ErrorKind.REFUSED, ErrorKind.CONNECTION})


def _declared_metrics_ports(pod: Mapping[str, Any]) -> dict[int, int]:
    """Local rank -> port, from the pod's ``metrics-<i>`` container ports.

    The pod says where its ranks listen: on the host network a job's ports are a block of
    its own (``api.hostports``), so the scraper follows the pod rather than the spec.
    """
    out: dict[int, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            rank = metrics_port_rank(str(port.get("name") or ""))
            value = port.get("containerPort")
            if rank is not None and isinstance(value, int) and 0 < value < 65536:
                out.setdefault(rank, value)
    return out


def scrape_targets(
    spec: api.GPUTrainingJobSpec | Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    uid: str | None = None,
    host_ports: tuple[int, int] = HOST_RANGE,
) -> list[ScrapeTarget]:
    """One target per rank of every running pod with an IP (camelCase pod dicts).

    Rank r of node n listens on its pod's ``metrics-<r>`` port (else metricsPort + r); its
    global rank is
    n * procsPerNode + local rank (torchrun's static rendezvous). With `uid`, only pods
    whose controller is that job are scraped (an old job's pods under the same name are not).
    A pod on its node's network is scraped only on the ports the job was given
    (:func:`~gpujob_operator.api.hostports.scrape_port`; `host_ports`: the operator's range).
    """
    s = api.parse_spec(spec)
    procs = s.procs_per_node
    out: list[ScrapeTarget] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
            continue
        if uid is not None and controller_uid(pod) != uid:
            continue
        try:
            node_rank = int((meta.get("labels") or {}).get(LABEL_NODE_RANK, ""))
        except ValueError:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        declared = _declared_metrics_ports(pod)
        on_host = bool((pod.get("spec") or {}).get("hostNetwork"))
        for local in range(procs):
            port = scrape_port(s, uid, local, declared.get(local), on_host, host_ports)
            if port is None:
                continue  # a node port the job was not given: never asked
            out.append(
                ScrapeTarget(
                    url=f"http://{host}:{port}{contract.METRICS_PATH}",
                    pod=str(meta.get("name", "")),
                    node=str((pod.get("spec") or {}).get("nodeName") or ""),
                    node_rank=node_rank,
                    local_rank=local,
                    rank=node_rank * procs + local,
                )
            )
    return out


def exited_ranks(pods: Iterable[Mapping[str, Any]], uid: str | None = None) -> int:
    """The pods (of the job with `uid`, when given) whose containers all exited 0.

    Once the last rank is done a scrape round finds no running pod; these tell that story
    apart from pods that are not running yet.
    """
    mine = pods if uid is None else owned(pods, uid)
    return sum(1 for pod in mine if (pod.get("status") or {}).get("phase") == "Succeeded")


class JobMonitor:
    """One job's window, verdict hysteresis and transition memory."""

    def __init__(
        self,
        spec: api.GPUTrainingJobSpec | Mapping[str, Any] | Settings,
        *,
        generation: int | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self.settings = spec if isinstance(spec, Settings) else Settings.from_spec(spec)
        self.generation = generation
        self.refresh_seconds = refresh_seconds
        self.window = Window(
            self.settings.max_points(), self.settings.window_seconds, _max_series(spec)
        )
        self._rejected: set[str] = set()
        """Kinds of rejected input already reported by an Event (once per kind and attempt)."""
        self.verdict = hysteresis.VerdictState()
        self._metrics_ok: bool | None = None
        self._stretch_said: tuple[float, str] | None = None
        """(interval, words) the condition last said of the stretch."""
        self._stretch_warned = False
        self._first_seen: float | None = None
        self._finished = False
        self._last_step: float | None = None
        self._stall_streak = 0
        self._clock = PatchClock()
        self.progress_memory = ProgressMemory()
        """What progress keeps between scrapes and attempts (`carry` seeds it from status)."""
        self.hang: Mapping[str, Any] | None = None
        """``status.hangEvidence`` of the current stall, once taken (the metrics task sets
        it): its answer joins the Stalled condition's message and the Stalled verdict."""

    def reset(self) -> None:
        """Forget the window and verdict (after a gang restart or a resume)."""
        self.window.clear()
        self.verdict = hysteresis.VerdictState()
        self._metrics_ok = None
        self._first_seen = None
        self._finished = False
        self._last_step = None
        self._stall_streak = 0
        self._rejected = set()
        self.progress_memory = self.progress_memory.restarted()

    def carry(
        self,
        progress: Mapping[str, Any] | None,
        attempt: int,
        rate_since: Mapping[str, Any] | None = None,
    ) -> None:
        """Go on from the job's status.progress in attempt `attempt`: the last known and the
        furthest step, and the ETA's basis (``operatorState.rateSince``) when it was taken in
        this attempt (so neither a gang restart nor an operator restart drops the step to 0
        or loses the furthest)."""
        known = dict(progress or {})
        if rate_since is not None:
            known["rateSince"] = rate_since
        self.progress_memory = ProgressMemory.from_status(known, attempt)

    def rank_gpus(self) -> dict[int, str]:
        """Each rank's CUDA device UUID, where its allocator series named one."""
        return {s.rank: s.uuid for s in self.window.ranks.values() if s.uuid}

    def scrape_targets(
        self,
        spec: api.GPUTrainingJobSpec | Mapping[str, Any],
        pods: Iterable[Mapping[str, Any]],
        uid: str | None = None,
        host_ports: tuple[int, int] = HOST_RANGE,
    ) -> list[ScrapeTarget]:
        """Same as the module function (kept here for a one-object API)."""
        return scrape_targets(spec, pods, uid, host_ports)

    def observe(
        self,
        results: Sequence[ScrapeResult],
        now: float,
        *,
        exited: int = 0,
        stretch: Stretch | None = None,
    ) -> MonitorUpdate:
        """Fold one round of scrapes into the window and evaluate it.

        `exited`: pods of the job that already succeeded (`exited_ranks`); with them, a round
        that reached no rank is the job finishing, not metrics going missing. `stretch`: the
        job is scraped less often than it asks (its share of the scrape CPU); said in
        MetricsAvailable.
        """
        dropped_series = dropped_values = 0
        notes: dict[str, list[str]] = {}
        capped = self.window.dropped_series
        for r in results:
            dropped_series += r.dropped_series
            dropped_values += r.dropped_values
            for kind, text in r.notes:
                notes.setdefault(kind, []).append(text)
            if r.ok:
                fr = r.frame
                if fr is None:  # samples handed in directly (tests, other callers): admit them
                    adm = guard.admit(frame(r.samples, r.t), r.target.rank, r.t)
                    fr = adm.frame
                    dropped_series += adm.dropped_series
                    dropped_values += adm.dropped_values
                    for kind, text in adm.notes:
                        notes.setdefault(kind, []).append(text)
                self.window.add(r.t, r.target.pod, r.target.node, fr)
        if self.window.dropped_series > capped:
            dropped_series += self.window.dropped_series - capped
            notes.setdefault(guard.KIND_GPUS, []).append(
                f"the job's series exceed the cap of {self.window.max_series}"
            )
        self.window.end_round(now, {r.target.pod for r in results})
        result = analyze(self.window, self.settings, now, self.progress_memory)
        if result.memory is not None:
            self.progress_memory = result.memory
        step, total = result.progress.get("step"), result.progress.get("totalSteps")
        eta = result.progress.get("etaSeconds")
        # Done, or so close that ranks exiting between two scrapes is the likely story.
        self._finished = self._finished or (step is not None and bool(total) and step >= total)
        self._finished = self._finished or (eta is not None and float(eta) <= NEARLY_DONE_SECONDS)
        # Every rank at its own target is done too, though the job's step is short of its total.
        self._finished = self._finished or result.stall_reason == c.RANKS_FINISHED
        # A round without a new step carries no new evidence (ranks finishing, a pause): it
        # neither confirms nor clears a verdict, except the ones that are about not stepping.
        urgent = result.verdict is not None and result.verdict.verdict in (
            STALLED,
            HARDWARE_FAULT,
        )
        change = None
        if urgent or step is None or self._last_step is None or step > self._last_step:
            self.verdict, change = hysteresis.step(
                self.verdict, result.verdict, now, self.settings.hysteresis_windows
            )
        self._last_step = step if step is not None else self._last_step
        failures = [r for r in results if not r.ok]
        events: list[Event] = []
        metrics = self._metrics_condition(results, failures, now, events, exited)
        if results and stretch is not None:
            metrics = self._stretched(metrics, stretch, now, events)
        rejected = _rejected_text(dropped_series, dropped_values, notes)
        missing = _missing_text(result.missing_ranks, len(self.window.ranks), self.settings)
        targets = result.target_note
        if rejected or missing or targets:
            parts = (metrics["message"], missing, targets, rejected)
            message = "; ".join(x for x in parts if x)
            metrics = {**metrics, "message": c.clip(message, c.MESSAGE_MAX_LENGTH)}
        new_kinds = sorted(set(notes) - self._rejected)
        if new_kinds:
            self._rejected |= set(new_kinds)
            events.append(Event("Warning", c.METRICS_REJECTED, rejected))
        conds = [metrics]
        if any(r.ok for r in results) and result.stalled_for is not None:
            # Only rounds that reached a rank count; one without any leaves the streak alone.
            stalled = any(v.verdict == STALLED for v in result.candidates)
            self._stall_streak = self._stall_streak + 1 if stalled else 0
            conds.append(self._stalled_condition(result, now))
        conds.append(self._bottleneck_condition(result, now))
        if change is not None:
            events.append(_verdict_event(change))
        pub = self.verdict.published
        bottleneck = pub.to_status(self.verdict.since) if pub is not None else None
        if bottleneck is not None and pub is not None and pub.verdict == STALLED and self.hang:
            bottleneck = with_hang(bottleneck, self.hang)
        return MonitorUpdate(
            now=now,
            progress=result.progress,
            bottleneck=bottleneck,
            gpus=result.gpus,
            conditions=conds,
            events=events,
            analysis=result,
            failures=failures,
            dropped_series=dropped_series,
            dropped_values=dropped_values,
            refresh_seconds=self.refresh_seconds,
            _clock=self._clock,
        )

    # ---- conditions ---------------------------------------------------------------------

    def _make(self, type_: str, ok: bool, reason: str, message: str, now: float) -> dict[str, Any]:
        when = datetime.fromtimestamp(now, UTC)
        return c.make(type_, c.TRUE if ok else c.FALSE, reason, message, when, self.generation)

    def _stretched(
        self, metrics: dict[str, Any], stretch: Stretch, now: float, events: list[Event]
    ) -> dict[str, Any]:
        """MetricsAvailable with the stretch said; a Warning when the first one begins (once
        per attempt: a job near its share may go in and out of it). The words change only
        when the interval does, so a stretched job's status is not rewritten every round."""
        said = self._stretch_said
        words = said[1] if said is not None and said[0] == stretch.interval else stretch.words()
        self._stretch_said = (stretch.interval, words)
        if not self._stretch_warned:
            self._stretch_warned = True
            events.append(Event("Warning", c.SCRAPE_INTERVAL_STRETCHED, words))
        if metrics["reason"] == c.ALL_RANKS_SCRAPED:
            message = f"{metrics['message']}; {words}"
            return self._make(c.METRICS_AVAILABLE, True, c.SCRAPE_INTERVAL_STRETCHED, message, now)
        return {**metrics, "message": f"{metrics['message']}; {words}"}

    def _metrics_condition(
        self,
        results: Sequence[ScrapeResult],
        failures: Sequence[ScrapeResult],
        now: float,
        events: list[Event],
        exited: int = 0,
    ) -> dict[str, Any]:
        if self._first_seen is None:
            self._first_seen = now
        only_down = bool(failures) and all(f.error in _DOWN for f in failures)
        if (
            results
            and only_down
            and self._metrics_ok is None
            and now - self._first_seen < STARTUP_GRACE
        ):
            # torchrun is still starting the ranks: no exporter yet is not a fault.
            waiting = f"{len(failures)}/{len(results)} rank endpoint(s) not up yet"
            return c.make(
                c.METRICS_AVAILABLE, c.UNKNOWN, c.WAITING_FOR_RANKS, waiting,
                datetime.fromtimestamp(now, UTC), self.generation,
            )  # fmt: skip
        if results and only_down and (self._finished or exited):
            # The last scrape showed the final step: the ranks are exiting, as they should.
            msg = f"the ranks reached the last step and are exiting ({len(failures)} gone)"
            return self._make(c.METRICS_AVAILABLE, True, c.RANKS_FINISHED, msg, now)
        if not results and (self._finished or exited):
            # Every rank's pod is done (a short last stretch can fall between two scrapes).
            msg = (
                f"the ranks finished: {exited} pod(s) succeeded, none left to scrape"
                if exited
                else "the ranks reached the last step and exited"
            )
            return self._make(c.METRICS_AVAILABLE, True, c.RANKS_FINISHED, msg, now)
        if not results:
            ok, reason, msg = False, c.NO_RANKS_TO_SCRAPE, "no running rank to scrape"
        elif not failures:
            ok, reason, msg = True, c.ALL_RANKS_SCRAPED, f"scraped {len(results)} rank(s)"
        else:
            listed = "; ".join(
                f"{f.target.pod} {f.target.url}: {f.error}: {c.clip(f.message, MAX_FAILURE_TEXT)}"
                for f in failures[:MAX_FAILURES_LISTED]
            )
            more = len(failures) - MAX_FAILURES_LISTED
            ok, reason = False, c.SCRAPE_FAILED
            msg = f"{len(failures)}/{len(results)} rank(s) failed: {listed}"
            if more > 0:
                msg += f"; and {more} more"
        if results and self._metrics_ok is not None and ok != self._metrics_ok:
            if ok:
                events.append(Event("Normal", c.METRICS_RECOVERED, msg))
            else:
                events.append(Event("Warning", c.SCRAPE_FAILED, msg))
        elif results and self._metrics_ok is None and not ok:
            events.append(Event("Warning", c.SCRAPE_FAILED, msg))
        if results:
            self._metrics_ok = ok
        return self._make(c.METRICS_AVAILABLE, ok, reason, msg, now)

    def _stalled_condition(self, result: Analysis, now: float) -> dict[str, Any]:
        stall = next((v for v in result.candidates if v.verdict == STALLED), None)
        if stall is not None:
            n = self._stall_streak
            answer = format_hang(self.hang)
            if n >= STALL_CONFIRM_SCRAPES:
                msg = f"{stall.summary} (confirmed by {n} consecutive scrapes){answer}"
                return self._make(c.STALLED, True, c.STALL_CONFIRMED, msg, now)
            return self._make(c.STALLED, True, c.STALL_DETECTED, stall.summary + answer, now)
        limit = result.stall_threshold or 0.0
        note = result.stall_note or f"steps advance (stall after {limit:.0f}s without one)"
        return self._make(c.STALLED, False, result.stall_reason, note, now)

    def _bottleneck_condition(self, result: Analysis, now: float) -> dict[str, Any]:
        pub = self.verdict.published
        if pub is None:
            why = result.not_ready_reason or "waiting for the first evaluation"
            return self._make(c.BOTTLENECK_DETECTED, False, c.WARMING_UP, why, now)
        if pub.verdict == HEALTHY:
            return self._make(c.BOTTLENECK_DETECTED, False, c.NO_BOTTLENECK, pub.summary, now)
        if pub.severity == INFO:  # ComputeBound: what a healthy job looks like, with its MFU
            return self._make(c.BOTTLENECK_DETECTED, False, pub.verdict, pub.summary, now)
        return self._make(c.BOTTLENECK_DETECTED, True, pub.verdict, pub.summary, now)


def with_hang(bottleneck: dict[str, Any], evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The Stalled verdict, naming the rank the evidence named (it knows better than the
    step counts, which a hung rank and its waiting peers share)."""
    out = {**bottleneck, "evidence": {**(bottleneck.get("evidence") or {})}}
    out["evidence"]["hang"] = str(evidence.get("summary", ""))[:1024]
    if evidence.get("configMap"):
        out["evidence"]["hangConfigMap"] = str(evidence["configMap"])
    culprits = evidence.get("culprits") or []
    if culprits:
        out.update(rank=int(culprits[0]), pod=evidence.get("pod"), node=evidence.get("node"))
        if evidence.get("gpu"):
            out["gpuUUID"] = evidence["gpu"]
    return out


def _max_series(spec: api.GPUTrainingJobSpec | Mapping[str, Any] | Settings) -> int:
    """Series a job's window may hold: its ranks, and a generous GPU allowance per node."""
    if isinstance(spec, Settings):
        return MAX_SERIES
    s = api.parse_spec(spec)
    return s.nodes * s.procs_per_node + s.nodes * max(2 * s.gpus_per_node, 16)


def _rejected_text(series: int, values: int, notes: Mapping[str, Sequence[str]]) -> str:
    if not series and not values:
        return ""
    counts = " and ".join(
        f"{n} {what}" for n, what in ((series, "series"), (values, "value(s)")) if n
    )
    texts = list(
        dict.fromkeys(c.clip(t, MAX_FAILURE_TEXT) for kind in sorted(notes) for t in notes[kind])
    )
    more = f"; and {len(texts) - MAX_NOTES_LISTED} more" if len(texts) > MAX_NOTES_LISTED else ""
    if not texts:
        return f"rejected {counts} from the payloads"
    return f"rejected {counts} from the payloads: " + "; ".join(texts[:MAX_NOTES_LISTED]) + more


def _missing_text(missing: Sequence[tuple[int, str]], seen: int, settings: Settings) -> str:
    if not missing:
        return ""
    shown = ", ".join(f"{rank} ({pod})" for rank, pod in missing[:MAX_FAILURES_LISTED])
    more = (
        f" and {len(missing) - MAX_FAILURES_LISTED} more"
        if len(missing) > MAX_FAILURES_LISTED
        else ""
    )
    return (
        f"rank(s) {shown}{more} sent nothing for over {settings.window_seconds:.0f}s: progress "
        f"and throughput come from the {seen - len(missing)} rank(s) that did"
    )


def _verdict_event(change: hysteresis.Change) -> Event:
    v = change.verdict
    was = f" (was {change.previous})" if change.previous else ""
    message = f"{v.verdict}{was}: {v.summary}"
    if v.verdict == STALLED:
        return Event("Warning", c.STALL_DETECTED, message)
    if change.previous == STALLED:
        return Event("Normal", c.STALL_CLEARED, message)
    warn = v.severity in (WARNING, CRITICAL)
    return Event("Warning" if warn else "Normal", c.BOTTLENECK_CHANGED, message)
