"""What the framework callbacks share: tracker ownership, phases opened in one hook and
closed in another, and the rule that telemetry never stops training."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import gpujob_trainer
from gpujob_trainer import contract
from gpujob_trainer.tracker import Tracker

log = logging.getLogger("gpujob_trainer")

F = TypeVar("F", bound=Callable[..., Any])


def never_raises(method: F) -> F:
    """A callback method whose errors are logged (once per method), never raised: a
    telemetry bug must not end a training run."""
    warned = False

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        try:
            return method(*args, **kwargs)
        except Exception as exc:  # telemetry never stops training
            if not warned:
                warned = True
                log.exception("gpujob: %s failed (%s); training goes on", method.__name__, exc)
            return None

    return guarded  # type: ignore[return-value]


def asked_from_env() -> bool:
    """Whether the env asks for the callback in every Trainer (`GPUJOB_FRAMEWORK_CALLBACK`)."""
    value = os.environ.get(contract.ENV_FRAMEWORK_CALLBACK, "").strip().lower()
    return value in ("1", "true", "on", "yes")


class OpenPhases:
    """Busy phases a framework opens in one hook and ends in another (`Tracker.phase`)."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._open: dict[str, contextlib.AbstractContextManager[None]] = {}

    def open(self, name: str) -> None:
        if name in self._open:
            return
        block = self._tracker.phase(name)
        block.__enter__()
        self._open[name] = block

    def close(self, name: str) -> None:
        block = self._open.pop(name, None)
        if block is not None:
            block.__exit__(None, None, None)

    def close_all(self) -> None:
        for name in reversed(list(self._open)):
            self.close(name)

    def __contains__(self, name: str) -> bool:
        return name in self._open


class TrackerOwner:
    """The callback's tracker: the one given, or one made on first use and closed at the end
    (then with hook_optimizers=False: the framework's own step hook ends each step)."""

    def __init__(self, tracker: Tracker | None, init_kwargs: dict[str, Any]) -> None:
        if tracker is not None and tracker._hook_optimizers:
            log.warning(
                "gpujob: the tracker given to GPUJobCallback hooks every optimizer; make it "
                "with hook_optimizers=False, so that the framework's step events alone end steps"
            )
        self._given = tracker
        self._init_kwargs = init_kwargs
        self.tracker: Tracker | None = tracker
        self.phases: OpenPhases | None = OpenPhases(tracker) if tracker is not None else None
        self._wrapped: set[tuple[int, int]] = set()

    def get(self) -> Tracker:
        if self.tracker is None or self.tracker.closed:
            kwargs = {"hook_optimizers": False, **self._init_kwargs}
            self.tracker = gpujob_trainer.init(**kwargs)
            self.phases = OpenPhases(self.tracker)
        return self.tracker

    def wrap_model(self, model: Any) -> None:
        """Time the model's forward and backward, once per tracker and model (a second
        `train()` or `fit()` with a tracker that was given finds them timed already)."""
        tracker = self.get()
        key = (id(tracker), id(model))
        if key not in self._wrapped:
            self._wrapped.add(key)
            tracker.wrap_model(model)

    def open_phases(self) -> OpenPhases:
        self.get()
        assert self.phases is not None
        return self.phases

    def close(self, linger: float) -> None:
        """End open phases; close the tracker only if this callback made it."""
        if self.phases is not None:
            self.phases.close_all()
        if self.tracker is not None and self._given is None and not self.tracker.closed:
            self.tracker.close(linger)
