"""The start-time forecast's core on scripted clusters: pools, holders with and without ETAs,
queues of waiting gangs (lifecycle/forecast/simulation.py)."""

from __future__ import annotations

import pytest

from gpujob_operator.lifecycle.forecast.simulation import (
    EXACT,
    LOWER_BOUND,
    UNKNOWN,
    Forecast,
    Holder,
    Waiter,
    forecast_all,
)

NOW = 1_000_000.0


def nodes(*names: str, gpus: int = 4) -> dict[str, int]:
    return {n: gpus for n in names}


def gang(name: str, pools: list[str], count: int = 1, per: int = 4, **kw: object) -> Waiter:
    return Waiter(name, tuple((p,) for p in pools), count, per, **kw)  # type: ignore[arg-type]


def test_one_holder_with_a_known_eta_gives_an_exact_start_at_that_eta() -> None:
    got = forecast_all(
        NOW, nodes("n1"), [Holder("job a", {"n1": 4}, NOW + 600)], [gang("w", ["n1"])]
    )["w"]
    assert (got.start, got.confidence, got.latest) == (NOW + 600, EXACT, None)
    assert got.waits_for == ("job a",) and "after job a end" in got.basis


def test_free_gpus_start_it_now() -> None:
    got = forecast_all(
        NOW, nodes("n1", "n2"), [Holder("job a", {"n1": 4}, None)], [gang("w", ["n1", "n2"])]
    )["w"]
    assert (got.start, got.confidence, got.basis) == (NOW, EXACT, "GPUs free")


def test_an_overrunning_holder_is_taken_to_end_now_not_in_the_past() -> None:
    got = forecast_all(
        NOW, nodes("n1"), [Holder("job a", {"n1": 4}, NOW - 300)], [gang("w", ["n1"])]
    )["w"]
    assert got.start == NOW


def test_a_queue_starts_in_order_and_a_waiter_of_unknown_duration_makes_the_rest_bounds() -> None:
    holders = [Holder("job a", {"q": 4}, NOW + 100), Holder("job b", {"q": 4}, NOW + 300)]
    waiters = [gang(f"w{i}", ["q"]) for i in range(1, 4)]
    got = forecast_all(NOW, {"q": 8}, holders, waiters)
    assert (got["w1"].start, got["w1"].confidence, got["w1"].ahead) == (NOW + 100, EXACT, 0)
    # w1 never ran: it may end at once (w2 at a's end) or never (w2 at b's end).
    assert (got["w2"].start, got["w2"].latest, got["w2"].confidence) == (
        NOW + 100,
        NOW + 300,
        LOWER_BOUND,
    )
    assert "w1" in got["w2"].reason and got["w2"].ahead == 1
    # w3 needs w1 or w2 to end: no latest start while neither duration is known.
    assert (got["w3"].start, got["w3"].latest, got["w3"].confidence) == (
        NOW + 100,
        None,
        LOWER_BOUND,
    )


def test_a_waiter_held_back_only_by_a_strict_queues_order_says_so() -> None:
    """w2 could use n2 now, but w1 (ahead, sharing n1) starts first, at a's end."""
    holders = [Holder("job a", {"n1": 4}, NOW + 100)]
    waiters = [gang("w1", ["n1"], strict=True), gang("w2", ["n1", "n2"], strict=True)]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, waiters)
    assert got["w2"].start == NOW + 100
    assert got["w2"].basis == "once the jobs ahead of it have started; 1 ahead in queue"


def fleet(strict: bool) -> dict[str, Forecast]:
    """A queue of 8 GPUs, 6 held for 10 h; a (8 GPUs, runs 1 h) then b (2 GPUs) wait."""
    holders = [Holder("job h", {"cq": 6}, NOW + 36_000)]
    waiters = [
        gang("a", ["cq"], per=8, duration=3600.0, queue="cq", strict=strict),
        gang("b", ["cq"], per=2, queue="cq", strict=strict),
    ]
    return forecast_all(NOW, {"cq": 8}, holders, waiters)


def test_best_effort_a_small_gang_behind_one_that_does_not_fit_starts_now_not_exact() -> None:
    """Kueue's default BestEffortFIFO (and kube-scheduler) start b at once, past a."""
    b = fleet(strict=False)["b"]
    assert (b.start, b.latest, b.confidence) == (NOW, None, LOWER_BOUND)
    assert b.reason.startswith("jumps ahead of a, which does not fit yet")
    a = fleet(strict=False)["a"]
    # a now waits for b too: at the earliest h's end (b over at once), else never.
    assert (a.start, a.confidence, a.reason) == (NOW + 36_000, LOWER_BOUND, "no known end: b")


def test_strict_fifo_holds_the_small_gang_behind_the_head_exactly() -> None:
    got = fleet(strict=True)
    assert (got["a"].start, got["a"].confidence) == (NOW + 36_000, EXACT)
    assert (got["b"].start, got["b"].confidence) == (NOW + 39_600, EXACT)
    assert got["b"].waits_for == ("a",)


def test_a_strict_queue_holds_back_only_its_own_waiters() -> None:
    """Two ClusterQueues in one cohort: q1's head waits, q2's waiter starts (and is not
    Exact: it jumps ahead of q1's head), q1's second waits behind its head."""
    cap = {"cq:q1/f": 8, "cq:q2/f": 8, "cohort:c/f": 8}
    holders = [Holder("job h", {"cq:q1/f": 6, "cohort:c/f": 6}, NOW + 100)]

    def w(name: str, q: str, per: int) -> Waiter:
        return Waiter(name, ((f"cq:{q}/f", "cohort:c/f"),), 1, per, 50.0, queue=q, strict=True)

    got = forecast_all(
        NOW, cap, holders, [w("head", "q1", 8), w("next", "q1", 2), w("other", "q2", 2)]
    )
    assert (got["head"].start, got["head"].confidence) == (NOW + 100, EXACT)
    assert (got["next"].start, got["next"].confidence) == (NOW + 150, EXACT)
    assert (got["other"].start, got["other"].confidence) == (NOW, LOWER_BOUND)


def test_the_latest_start_is_never_before_the_earliest() -> None:
    holders = [Holder("pod x", {"n1": 4}, None), Holder("job a", {"n2": 4}, NOW + 60)]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, [gang("w", ["n1", "n2"])])["w"]
    assert got.latest is not None and got.start is not None and got.latest >= got.start
    assert got.basis == (
        "now if the holders without a known end were over, at the latest after job a end"
    )


def test_a_requeued_waiter_with_a_measured_duration_keeps_the_next_one_exact() -> None:
    holders = [Holder("job a", {"q": 4}, NOW + 100), Holder("job b", {"q": 4}, NOW + 1000)]
    waiters = [gang("w1", ["q"], duration=50.0), gang("w2", ["q"])]
    got = forecast_all(NOW, {"q": 8}, holders, waiters)
    assert (got["w2"].start, got["w2"].confidence) == (NOW + 150, EXACT)
    assert got["w2"].waits_for == ("w1",)


def test_fragmentation_enough_gpus_in_total_but_not_on_one_node() -> None:
    holders = [
        Holder("job a", {"n1": 2}, NOW + 100),
        Holder("job b", {"n2": 2}, NOW + 200),
    ]
    one_node = forecast_all(
        NOW, nodes("n1", "n2"), holders, [gang("w", ["n1", "n2"], count=1, per=4)]
    )
    assert one_node["w"].start == NOW + 100  # 4 GPUs free in total now, 2 per node
    two_nodes = forecast_all(
        NOW, nodes("n1", "n2"), holders, [gang("w", ["n1", "n2"], count=2, per=4)]
    )
    assert (two_nodes["w"].start, two_nodes["w"].waits_for) == (NOW + 200, ("job b",))


def test_a_holder_without_an_eta_makes_it_a_lower_bound_naming_that_holder() -> None:
    holders = [Holder("pod x/notebook", {"n1": 4}, None), Holder("job a", {"n2": 4}, NOW + 60)]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, [gang("w", ["n1", "n2"], count=2)])["w"]
    assert (got.start, got.latest, got.confidence) == (NOW + 60, None, LOWER_BOUND)
    assert got.reason == "no known end: pod x/notebook"


def test_a_holder_without_an_eta_on_nodes_it_cannot_use_leaves_it_exact() -> None:
    holders = [Holder("pod x/notebook", {"n1": 4}, None), Holder("job a", {"n2": 4}, NOW + 60)]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, [gang("w", ["n2"])])["w"]
    assert (got.start, got.confidence) == (NOW + 60, EXACT)


def test_a_holder_without_an_eta_that_could_free_a_node_first_brackets_the_start() -> None:
    holders = [Holder("pod x/notebook", {"n1": 4}, None), Holder("job a", {"n2": 4}, NOW + 60)]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, [gang("w", ["n1", "n2"])])["w"]
    assert (got.start, got.latest, got.confidence) == (NOW, NOW + 60, LOWER_BOUND)


def test_a_gang_bigger_than_its_pools_is_unknown_and_blocks_no_one_behind_it() -> None:
    waiters = [gang("huge", ["n1", "n2"], count=3), gang("small", ["n1", "n2"])]
    got = forecast_all(NOW, nodes("n1", "n2"), [Holder("job a", {"n1": 4}, NOW + 10)], waiters)
    assert (got["huge"].start, got["huge"].confidence) == (None, UNKNOWN)
    assert got["huge"].reason == "needs 3 nodes with 4 GPUs each; 2 eligible nodes can hold 4"
    assert (got["small"].start, got["small"].confidence) == (NOW, EXACT)


def test_quota_too_small_says_what_the_queue_can_give() -> None:
    got = forecast_all(NOW, {"cq": 8}, [], [gang("w", ["cq"], per=16)])["w"]
    assert got.confidence == UNKNOWN
    assert got.reason == "needs 16 GPUs; the most its queue can ever give is 8"


def test_a_preempted_holder_or_one_that_finishes_early_moves_the_forecast_earlier() -> None:
    holders = [Holder("job a", {"n1": 4}, NOW + 900)]
    before = forecast_all(NOW, nodes("n1"), holders, [gang("w", ["n1"])])["w"]
    after = forecast_all(NOW + 30, nodes("n1"), [], [gang("w", ["n1"])])["w"]
    assert before.start == NOW + 900 and after.start == NOW + 30


def test_waiters_that_share_no_pool_do_not_wait_for_each_other() -> None:
    holders = [Holder("job a", {"n1": 4}, NOW + 500)]
    waiters = [gang("first", ["n1"]), gang("other-pool", ["n2"])]
    got = forecast_all(NOW, nodes("n1", "n2"), holders, waiters)
    assert got["first"].start == NOW + 500
    assert (got["other-pool"].start, got["other-pool"].ahead) == (NOW, 0)


def test_a_gang_placed_ahead_takes_the_fullest_nodes_that_fit() -> None:
    """Best fit: the gang ahead takes n1 (exactly 4 free), leaving n2's 8 for the next."""
    cap = {"n1": 4, "n2": 8}
    waiters = [gang("w1", ["n1", "n2"]), gang("w2", ["n1", "n2"], per=8, duration=None)]
    got = forecast_all(NOW, cap, [], waiters)
    assert got["w1"].start == NOW and got["w2"].start == NOW


def test_a_slot_of_several_pools_needs_room_in_each_cohort_and_queue() -> None:
    cap = {"cq:a/f": 8, "cohort:c/f": 8}
    holders = [Holder("workload other", {"cohort:c/f": 8}, NOW + 120)]
    w = Waiter("w", (("cq:a/f", "cohort:c/f"),), 1, 4)
    got = forecast_all(NOW, cap, holders, [w])["w"]
    assert got.start == NOW + 120


@pytest.mark.parametrize("count", [1, 5])
def test_names_are_capped_in_the_reason(count: int) -> None:
    holders = [Holder(f"pod p{i}", {"n1": 1}, None) for i in range(count)]
    got = forecast_all(NOW, {"n1": max(count, 1)}, holders, [gang("w", ["n1"], per=count)])["w"]
    assert got.confidence == LOWER_BOUND
    assert ("and 1 more" in got.reason) == (count == 5)
