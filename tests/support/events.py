"""A job's Events, and a wait for one of them.

The operator posts Events from a queue after the status write that goes with them, so a
test that has seen a phase must wait for the Event it names, not read the list once.
"""

from __future__ import annotations

from tests.support.kube import Kube
from tests.support.waiting import wait_until


def events(kube: Kube, name: str) -> list[str]:
    """The reasons of the Events on the GPUTrainingJob ``name``, oldest first as listed."""
    return [
        e["reason"]
        for e in kube.list("events")
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "GPUTrainingJob"
    ]


def wait_event(kube: Kube, name: str, reason: str, timeout: float = 30) -> list[str]:
    """Wait until job ``name`` has an Event of ``reason``; return all its reasons then."""
    return wait_until(
        lambda: (lambda seen: seen if reason in seen else None)(events(kube, name)),
        timeout,
        f"the {reason} Event of job {name}",
    )
