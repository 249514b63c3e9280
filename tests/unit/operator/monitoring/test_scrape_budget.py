"""The scrape CPU shared between jobs: max-min fair shares, a stretched interval for the job
over its share (said in words that do not move with noise), expiry of a job that stopped."""

from __future__ import annotations

import pytest

from gpujob_operator.monitoring.scrape.budget import KEEP_MIN_SECONDS, ScrapeBudget, Stretch


def test_a_job_alone_may_use_the_whole_budget() -> None:
    b = ScrapeBudget(cores=1.0)
    assert b.pace("big", 5.0, 4.0, 16384, now=0.0) == (5.0, None)  # 0.8 core at 5 s
    assert b.pace("big", 5.0, 4.0, 16384, now=5.0) == (5.0, None)


def test_the_heavy_job_is_paced_by_what_the_light_ones_leave_and_they_never_are() -> None:
    b = ScrapeBudget(cores=1.0)
    for i in range(100):  # a hundred 8-rank jobs: 1 ms a round each, at 5 s
        assert b.pace(f"small-{i}", 5.0, 0.001, 8, now=0.0) == (5.0, None)
    # 512 endpoints of 256 KiB at 1 s: ~4.3 s of parsing a round
    interval, stretch = b.pace("hostile", 1.0, 4.3, 512, now=1.0)
    assert stretch is not None and interval == 5.0  # 4.3 / (1 - 100 * 0.0002), rounded up
    assert stretch.share == pytest.approx(0.98)
    assert 4.3 / interval <= stretch.share
    for i in range(100):  # the others keep their own interval
        assert b.pace(f"small-{i}", 5.0, 0.001, 8, now=6.0) == (5.0, None)


def test_two_heavy_jobs_get_at_least_half_each() -> None:
    b = ScrapeBudget(cores=1.0)
    b.pace("a", 1.0, 3.0, 512, now=0.0)  # alone: the whole core, stretched to 3 s
    interval, stretch = b.pace("b", 1.0, 3.0, 512, now=0.5)
    assert stretch is not None and stretch.share == pytest.approx(0.5)  # a uses its 1.0
    assert interval == 6.0
    interval, stretch = b.pace("a", 1.0, 3.0, 512, now=3.0)
    assert stretch is not None and stretch.share == pytest.approx(0.5) and interval == 6.0


def test_a_job_that_stopped_scraping_leaves_its_share() -> None:
    b = ScrapeBudget(cores=1.0)
    b.pace("gone", 1.0, 0.9, 64, now=0.0)
    assert b.share("other", now=1.0) == pytest.approx(0.5)  # equal share: gone used 0.9
    assert b.share("other", now=KEEP_MIN_SECONDS + 2) == pytest.approx(1.0)  # expired
    b.pace("gone", 1.0, 0.9, 64, now=100.0)
    b.forget("gone")
    assert b.jobs == 0 and b.share("other", now=101.0) == pytest.approx(1.0)


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
