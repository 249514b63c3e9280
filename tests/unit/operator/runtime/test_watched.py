"""Workloads read from the watch's cache: never claims what it does not know."""

from __future__ import annotations

from typing import Any

from gpujob_operator.runtime import watched
from gpujob_operator.runtime.watched import WatchedObjects


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def wl(rv: str, admitted: bool = False, name: str = "job-a") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "resourceVersion": rv},
        "status": {"conditions": [{"type": "Admitted", "status": str(admitted)}]},
    }


def test_what_the_watch_delivered_is_read_as_a_copy_and_absence_is_never_cached() -> None:
    cache = WatchedObjects(clock=Clock())
    assert cache.get("ml", "job-a") is None  # unknown: the caller reads the API server
    cache.seen(None, wl("5"))  # kopf's initial listing
    got = cache.get("ml", "job-a")
    assert got == wl("5")
    got["status"] = {}  # a caller's change is its own
    assert cache.get("ml", "job-a") == wl("5")
    cache.read("ml", "job-a", None)  # a GET found nothing: not cached as "gone"
    assert cache.get("ml", "job-a") is None and len(cache) == 0
    cache.seen("ADDED", wl("6"))
    cache.seen("DELETED", wl("7"))
    assert cache.get("ml", "job-a") is None
    assert (cache.hits, cache.misses) == (2, 3)


def test_an_older_event_never_replaces_a_newer_read() -> None:
    cache = WatchedObjects(clock=Clock())
    cache.read("ml", "job-a", wl("20", admitted=True))
    cache.seen("MODIFIED", wl("19"))  # delivered late, from before the read
    assert cache.get("ml", "job-a") == wl("20", admitted=True)
    cache.seen("MODIFIED", wl("21"))
    assert cache.get("ml", "job-a") == wl("21")


def test_the_operators_own_write_is_read_back_not_the_version_before_it() -> None:
    cache = WatchedObjects(clock=Clock())
    cache.seen("MODIFIED", wl("30", admitted=True))
    cache.wrote("ml", "job-a")  # e.g. the restart released its quota
    assert cache.get("ml", "job-a") is None


def test_an_entry_is_trusted_only_so_long_without_confirmation() -> None:
    clock = Clock()
    cache = WatchedObjects(trust_seconds=60, clock=clock)
    cache.seen("MODIFIED", wl("40"))
    clock.now += 59
    assert cache.get("ml", "job-a") is not None
    clock.now += 2  # a paused watch, a lost event: read it again
    assert cache.get("ml", "job-a") is None
    cache.read("ml", "job-a", wl("40"))
    assert cache.get("ml", "job-a") is not None


def test_the_cache_is_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(watched, "MAX_ENTRIES", 3)
    cache = WatchedObjects(clock=Clock())
    for i in range(5):
        cache.seen("ADDED", wl("1", name=f"j{i}"))
    assert len(cache) == 3 and cache.get("ml", "j4") is None
    cache.seen("MODIFIED", wl("2", name="j0"))  # a known one is still kept current
    assert cache.get("ml", "j0") == wl("2", name="j0")


def test_a_late_event_from_before_the_operators_write_is_not_taken_for_current() -> None:
    """Kueue re-admitted at 300 (read by GET); the operator then wrote the Workload; the
    watch, lagging, delivers the eviction of 250 and the re-admission of 300 only now."""
    cache = WatchedObjects(clock=Clock())
    cache.read("ml", "job-a", wl("300", admitted=True))
    cache.wrote("ml", "job-a")
    cache.seen("MODIFIED", wl("250"))
    cache.seen("MODIFIED", wl("300", admitted=True))
    assert cache.get("ml", "job-a") is None  # read afresh: what the write made
    cache.read("ml", "job-a", wl("301", admitted=True))
    assert cache.get("ml", "job-a") == wl("301", admitted=True)


def test_a_get_that_raced_the_deletion_does_not_bring_the_workload_back() -> None:
    cache = WatchedObjects(clock=Clock())
    cache.seen("MODIFIED", wl("50", admitted=True))
    cache.seen("DELETED", wl("51", admitted=True))
    cache.read("ml", "job-a", wl("50", admitted=True))  # the GET answered before the delete
    assert cache.get("ml", "job-a") is None
    deleting = wl("60") | {"metadata": wl("60")["metadata"] | {"deletionTimestamp": "now"}}
    cache.read("ml", "job-a", deleting)  # one being deleted is not kept either
    assert cache.get("ml", "job-a") is None
    cache.seen("MODIFIED", wl("55"))  # from before the deletion the GET saw
    assert cache.get("ml", "job-a") is None
    cache.seen("ADDED", wl("70"))  # created again under the same name: newer, kept
    assert cache.get("ml", "job-a") == wl("70")
