"""The scrape CPU shared between jobs: max-min fair shares over what each job asks for, a
stretched interval for the job over its share (in words that do not move with noise), and
the share of a job that stopped given back."""

from __future__ import annotations

import math

import pytest

from gpujob_operator.monitoring.scrape.budget import (
    KEEP_MIN_SECONDS,
    ScrapeBudget,
    Stretch,
    fair_level,
)


def test_the_fair_level_gives_the_small_what_they_ask_and_splits_the_rest() -> None:
    assert fair_level([0.1, 0.9, 0.9], 1.0) == pytest.approx(0.45)
    assert fair_level([0.2, 0.3], 1.0) == math.inf  # everything fits
    assert fair_level([2.0, 2.0, 2.0, 2.0], 1.0) == pytest.approx(0.25)
    assert fair_level([], 1.0) == math.inf


def test_a_job_alone_may_use_the_whole_budget() -> None:
    b = ScrapeBudget(cores=1.0)
    for now in (0.0, 5.0, 10.0):
        assert b.pace("big", 5.0, 4.0, 16384, now=now) == (5.0, None)  # 0.8 core at 5 s


def test_the_heavy_job_is_paced_by_what_the_light_ones_leave_and_they_never_are() -> None:
    b = ScrapeBudget(cores=1.0)
    for i in range(100):  # a hundred 8-rank jobs: 1 ms a round each, at 5 s
        assert b.pace(f"small-{i}", 5.0, 0.001, 8, now=0.0) == (5.0, None)
    # 512 endpoints of 256 KiB at 1 s: ~4.3 s of parsing a round; its first round is
    # counted, the next ones are paced
    b.pace("hostile", 1.0, 4.3, 512, now=1.0)
    interval, stretch = b.pace("hostile", 1.0, 4.3, 512, now=2.0)
    assert stretch is not None and interval == 5.0  # 4.3 / (1 - 100 * 0.0002), rounded up
    assert stretch.share == pytest.approx(0.98)
    for i in range(100):  # the others keep their own interval
        assert b.pace(f"small-{i}", 5.0, 0.001, 8, now=6.0) == (5.0, None)


def test_two_heavy_jobs_beside_a_light_one_get_equal_shares_whoever_came_first() -> None:
    b = ScrapeBudget(cores=1.0)
    b.pace("light", 1.0, 0.1, 8, now=0.0)
    b.pace("b", 1.0, 0.9, 512, now=0.0)
    b.pace("c", 1.0, 0.9, 512, now=0.5)
    for job in ("b", "c"):
        interval, stretch = b.pace(job, 1.0, 0.9, 512, now=2.0)
        assert stretch is not None and stretch.share == pytest.approx(0.45) and interval == 2.0
    assert b.pace("light", 1.0, 0.1, 8, now=2.0) == (1.0, None)


def test_a_job_that_stopped_scraping_leaves_its_share() -> None:
    b = ScrapeBudget(cores=1.0)
    b.pace("gone", 1.0, 3.0, 64, now=0.0)
    b.pace("other", 1.0, 3.0, 64, now=0.0)
    assert b.pace("other", 1.0, 3.0, 64, now=1.0)[0] == 6.0  # half the core each
    late = KEEP_MIN_SECONDS + 2  # "gone" sent nothing since: expired
    b.pace("other", 1.0, 3.0, 64, now=late)
    assert b.jobs == 1 and b.pace("other", 1.0, 3.0, 64, now=late + 1)[0] == 3.0
    b.pace("gone", 1.0, 3.0, 64, now=late + 1)
    b.forget("gone")  # its job ended: given back at the next ask
    assert b.jobs == 1 and b.pace("other", 1.0, 3.0, 64, now=late + 1.5)[0] == 3.0


def test_the_stretch_reads_the_same_from_round_to_round() -> None:
    a = Stretch(5.0, 12.0, 0.8213, 0.071, 1.0, 4096).words()
    b = Stretch(5.0, 12.0, 0.8249, 0.0712, 1.0, 4096).words()
    assert a == b
    assert a == (
        "scrape interval stretched to 12s from 5s: reading its 4096 endpoint(s) took 820 ms "
        "of operator CPU a round, over this job's share of the scrape budget (0.071 of 1 "
        "core(s), GPUJOB_SCRAPE_CPU_CORES)"
    )
    assert "took 2.5 s" in Stretch(1.0, 3.0, 2.51, 1.0, 1.0, 512).words()
