"""The order in which a pod's init containers run, as the kubelet runs them (pure).

Init containers start one after another, in spec order. A plain init container must exit
0 before the next starts; one that fails for good (restartPolicy Never, or its restart
was refused) fails the pod. A native sidecar (an init container with ``restartPolicy:
Always``) lets the next one start as soon as it is *started* (running, its startupProbe
passed) and keeps running beside the regular containers. Once every init container is
done (the sidecars started), the pod is initialized and its regular containers start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class InitFate:
    """What the order needs to know about one init container."""

    name: str
    sidecar: bool
    attempted: bool = False
    """Started at least once."""
    started: bool = False
    """Running now with its startupProbe (if any) passed."""
    succeeded: bool = False
    """A plain init container whose last attempt exited 0."""
    failed: bool = False
    """A plain init container that exited non-zero and will not be restarted."""


@dataclass(frozen=True)
class InitStep:
    """What to do next: start ``start``; or wait; or the pod is ``done`` / ``failed``."""

    start: str | None = None
    done: bool = False
    failed: bool = False


def next_step(fates: Sequence[InitFate]) -> InitStep:
    """The next init container to start, or whether initialization is done or failed."""
    for f in fates:
        if not f.attempted:
            return InitStep(start=f.name)
        if f.sidecar:
            if not f.started:
                return InitStep()
            continue
        if f.failed:
            return InitStep(failed=True)
        if not f.succeeded:
            return InitStep()
    return InitStep(done=True)


def incomplete(fates: Sequence[InitFate]) -> list[str]:
    """The init containers the ``Initialized`` condition names while it is False."""
    return [f.name for f in fates if not (f.started if f.sidecar else f.succeeded)]
