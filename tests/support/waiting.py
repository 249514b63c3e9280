"""Wait on a condition with a deadline: the only synchronisation tests use."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Return ``check()``'s first truthy value; fail with ``what`` and the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = check()
        if last:
            return last  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last value: {last!r}"
            )
        time.sleep(interval)
