"""Condition helpers: transition times, merging, and the derived display phase."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpujob_operator.api import conditions as c

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_time_round_trip_uses_z_and_whole_seconds() -> None:
    assert c.format_time(T0.replace(microsecond=123)) == "2026-01-02T03:04:05Z"
    assert c.format_time(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"
    assert c.parse_time("2026-01-02T03:04:05Z") == T0
    assert c.parse_time("2026-01-02T04:04:05+01:00") == T0
    assert c.parse_time(None) is None and c.parse_time("") is None


def test_set_condition_appends_then_keeps_time_while_status_holds() -> None:
    conds = c.set_condition([], c.RUNNING, "False", c.PODS_PENDING, "0/2", T0, 1)
    assert conds == [
        {
            "type": "Running",
            "status": "False",
            "reason": "PodsPending",
            "message": "0/2",
            "lastTransitionTime": "2026-01-02T03:04:05Z",
            "observedGeneration": 1,
        }
    ]
    same = c.set_condition(conds, c.RUNNING, "False", c.UNSCHEDULABLE, "no GPUs", T1, 2)
    assert same[0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert same[0]["reason"] == "Unschedulable" and same[0]["observedGeneration"] == 2
    flipped = c.set_condition(same, c.RUNNING, "True", c.ALL_RANKS_RUNNING, "2/2", T1)
    assert flipped[0]["lastTransitionTime"] == "2026-01-02T03:09:05Z"
    assert conds[0]["reason"] == "PodsPending", "input list must not be mutated"


def test_set_condition_keeps_order_and_other_types() -> None:
    conds = c.set_condition([], c.CREATED, "True", c.PODS_CREATED, "", T0)
    conds = c.set_condition(conds, c.RUNNING, "True", c.ALL_RANKS_RUNNING, "", T0)
    conds = c.set_condition(conds, c.CREATED, "False", c.GANG_RESTART, "", T1)
    assert [x["type"] for x in conds] == ["Created", "Running"]
    assert c.find(conds, c.CREATED)["reason"] == "GangRestart"  # type: ignore[index]


def test_merge_and_remove() -> None:
    base = c.set_condition([], c.RUNNING, "True", c.ALL_RANKS_RUNNING, "", T0)
    merged = c.merge_conditions(
        base,
        [
            c.make(c.RUNNING, "True", c.ALL_RANKS_RUNNING, "still", T1),
            c.make(c.STALLED, "True", c.STALL_DETECTED, "no step", T1),
        ],
        T1,
    )
    assert c.find(merged, c.RUNNING)["lastTransitionTime"] == c.format_time(T0)  # type: ignore[index]
    assert c.is_true(merged, c.STALLED)
    assert c.find(c.remove_condition(merged, c.STALLED), c.STALLED) is None


@pytest.mark.parametrize(
    ("trues", "phase"),
    [
        ([], "Pending"),
        ([c.CREATED], "Pending"),
        ([c.RUNNING], "Running"),
        ([c.RUNNING, c.RESTARTING], "Restarting"),
        ([c.RESTARTING], "Restarting"),
        ([c.SUSPENDED, c.RESTARTING], "Suspended"),
        ([c.SUCCEEDED, c.RUNNING], "Succeeded"),
        ([c.FAILED, c.SUCCEEDED], "Failed"),
    ],
)
def test_derive_phase_priority(trues: list[str], phase: str) -> None:
    conds: list[dict[str, object]] = []
    for t in trues:
        conds = c.set_condition(conds, t, "True", "R", "", T0)
    conds = c.set_condition(conds, c.BOTTLENECK_DETECTED, "True", "R", "", T0)
    assert c.derive_phase(conds) == phase
    assert phase in c.PHASES
    assert c.is_finished(conds) == (phase in ("Succeeded", "Failed"))


def test_false_conditions_do_not_count() -> None:
    conds = c.set_condition([], c.FAILED, "False", "R", "", T0)
    assert c.derive_phase(conds) == "Pending"
    assert not c.is_finished(conds)


def test_a_message_is_clipped_to_the_crds_limit_with_an_ellipsis() -> None:
    """The API server refuses a whole status patch over a message's maxLength: never send one."""
    from gpujob_operator.api.status import Condition

    long = c.make(c.METRICS_AVAILABLE, "False", c.SCRAPE_FAILED, "x" * 100_000, T0)
    assert len(long["message"]) == c.MESSAGE_MAX_LENGTH and long["message"].endswith("...")
    Condition.model_validate(long)  # within the CRD's maxLength
    merged = c.merge_conditions([], [{**long, "message": "y" * 40_000}], T0)
    assert len(merged[0]["message"]) == c.MESSAGE_MAX_LENGTH
    assert c.make(c.RUNNING, "True", c.ALL_RANKS_RUNNING, "short", T0)["message"] == "short"
    assert c.clip("abcdef", 6) == "abcdef" and c.clip("abcdefg", 6) == "abc..."
    assert c.clip("abcdefg", 2) == ".."
