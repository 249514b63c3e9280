"""``status.operatorState``: the operator's own bookkeeping, apart from the user's contract.

What the operator keeps only to resume its work after a restart: the backoff of a refused
create and the run of webhook denials, the attempts that made no progress, the ETA's rate
basis, the goodput ledger's cursor. Internal: not part of the API, free to change between
versions; a user or a tool reads ``status``'s other fields (:mod:`.status`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpujob_operator.api.statusbase import StatusModel, Time


class RateSince(StatusModel):
    """Where the ETA's step rate is measured from (kept so an operator restart keeps it)."""

    time: Time = Field(description="The scrape the rate is measured from.")
    step: int = Field(ge=0, description="The job's step at that scrape.")
    attempt: int = Field(ge=0, description="The gang attempt the basis belongs to.")


class AdmissionDenial(StatusModel):
    """The run of admission webhook denials being retried (spec.runPolicy.admissionRetrySeconds)."""

    since: Time | None = Field(
        default=None, description="The first denial of this run: the retries count from it."
    )
    target: str | None = Field(default=None, description="What was denied, e.g. pod j-node-0.")


class CreateBackoff(StatusModel):
    """A refused create being retried with backoff: kept in the status so that an operator
    restart resumes the backoff (and the gang's grace) instead of retrying every job at once."""

    tries: int | None = Field(
        default=None, ge=1, description="Refused creates in a row: the backoff's exponent."
    )
    since: Time | None = Field(
        default=None,
        description="The first refusal of this run: an incomplete gang's grace counts from it.",
    )
    retry_at: Time | None = Field(default=None, description="When the next create may be tried.")
    reason: str | None = Field(
        default=None, max_length=128, description="The refusal's reason, e.g. QuotaExceeded."
    )
    code: int | None = Field(default=None, description="The refusal's HTTP status code.")
    message: str | None = Field(
        default=None, max_length=1024, description="The API server's message, truncated."
    )
    target: str | None = Field(
        default=None, max_length=512, description="What was refused, e.g. pod j-node-0."
    )


class GoodputLedger(StatusModel):
    """The goodput ledger's cursor: what each planning pass needs to charge the time since
    the last one (the seconds themselves are the user's, in ``status.goodput``)."""

    accounted_until: Time | None = Field(
        default=None, description="The time up to which seconds are charged."
    )
    cause: str | None = Field(
        default=None,
        description="What the time from accountedUntil counts as: queued, startup, restart, "
        "stall or productive (split with checkpoint and eval); absent once finished.",
    )
    stage: Literal["Queued", "Starting", "Stepped"] | None = Field(
        default=None,
        description="How far the job ever got: never placed, placed without a step, stepped.",
    )
    attempt: int | None = Field(default=None, description="The attempt the accounting follows.")
    attempt_since: Time | None = Field(
        default=None, description="When the accounting first saw that attempt."
    )
    attempt_stepped: bool | None = Field(
        default=None, description="Whether that attempt has finished a step."
    )
    furthest_step: int | None = Field(
        default=None, description="The furthest step seen: a lower step is recomputation."
    )
    verdict: str | None = Field(
        default=None, description="The published verdict when last accounted."
    )
    rank: int | None = Field(default=None, description="The rank that verdict named, if one.")
    verdict_seconds: dict[str, float] | None = Field(
        default=None,
        max_length=16,
        description="Seconds each bottleneck verdict was published (at most 16 verdicts).",
    )
    rank_seconds: dict[str, float] | None = Field(
        default=None,
        max_length=8,
        description="Seconds each rank was named by the verdict (the 8 named longest).",
    )
    samples: float | None = Field(
        default=None, description="Samples of kept steps: samplesPerSecond over stepping time."
    )
    tokens: float | None = Field(default=None, description="Tokens of kept steps, likewise.")
    checkpoint_ratio: float | None = Field(
        default=None,
        description="The checkpoint share last seen while the job stepped: how stepping time "
        "is split until a newer one is seen.",
    )
    eval_ratio: float | None = Field(default=None, description="The eval share, likewise.")
    samples_per_second: float | None = Field(
        default=None, description="The throughput last seen while the job stepped."
    )
    tokens_per_second: float | None = Field(
        default=None, description="The token throughput last seen while the job stepped."
    )


class Suspect(StatusModel):
    """A node a published verdict of the current attempt named: blamed if the attempt ends."""

    node: str = Field(max_length=253, description="The node.")
    verdict: str = Field(max_length=64, description="HardwareFault or Straggler.")
    attempt: int = Field(description="The attempt the verdict was about.")
    since: Time | None = Field(
        default=None, description="Since when a pass sees it published (its open spell)."
    )
    held_seconds: int | None = Field(
        default=None, ge=0, description="Seconds it was published in its closed spells."
    )
    summary: str | None = Field(default=None, max_length=1024, description="Its summary.")


class InPlaceRestart(StatusModel):
    """An in-place gang restart under way: which attempt it brings the pods to, since when
    (its inPlaceTimeoutSeconds counts from it)."""

    attempt: int = Field(ge=0, description="The attempt the pods restart for.")
    since: Time = Field(
        description="When the restart began, or pods were last moved to the attempt (a wide "
        "gang's moves take several passes): inPlaceTimeoutSeconds counts from it."
    )


class OperatorState(StatusModel):
    """The operator's bookkeeping (internal, free to change between versions)."""

    rate_since: RateSince | None = Field(
        default=None,
        description="The ETA's basis: the first scrape after warm-up since the attempt's "
        "latest start or resume.",
    )
    create_backoff: CreateBackoff | None = Field(
        default=None,
        description="Set while a refused create of the gang or its Service is retried with "
        "backoff: tries, the first refusal and the next try, so that an operator restart "
        "neither resets the backoff nor retries every refused job at once.",
    )
    admission_denial: AdmissionDenial | None = Field(
        default=None,
        description="Set while an admission webhook denies the job's creates: since when, so "
        "that the bounded retry (spec.runPolicy.admissionRetrySeconds) survives an operator "
        "restart.",
    )
    attempts_without_progress: list[int] | None = Field(
        default=None,
        max_length=64,
        description="The consecutive failed attempts that ended without passing the furthest "
        "step reached before them, oldest first (spec.runPolicy.maxRestartsWithoutProgress).",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    furthest_step_at_attempt_start: int | None = Field(
        default=None,
        description="The furthest step any attempt had reached when the current attempt "
        "began: the current attempt makes progress once it passes it.",
    )
    goodput: GoodputLedger | None = Field(default=None, description="The goodput ledger's cursor.")
    suspects: list[Suspect] | None = Field(
        default=None,
        max_length=16,
        description="Nodes the current attempt's published verdicts named (HardwareFault, "
        "Straggler), blamed if the attempt ends (spec.runPolicy.avoidBlamedNodes).",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    in_place: InPlaceRestart | None = Field(
        default=None,
        description="The in-place gang restart under way (spec.runPolicy.restartStrategy), "
        "until every pod runs the new attempt.",
    )
    in_place_unsupported: str | None = Field(
        default=None,
        max_length=1024,
        description="Why this job's pods cannot restart in place (e.g. the image lacks the "
        "supervisor): later attempts are recreated.",
    )
    profile_request: str | None = Field(
        default=None,
        max_length=256,
        description="The last gpujob.dev/profile annotation value acted on (accepted or "
        "refused), so a later record in status.profile does not make it new again.",
    )
    profile_auto_attempt: int | None = Field(
        default=None,
        ge=0,
        description="The attempt spec.monitoring.profileOnVerdict last profiled (once per "
        "attempt, whatever manual captures come between).",
    )
