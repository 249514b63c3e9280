"""Exponential backoff with jitter, as pure functions (the caller supplies the randomness).

Two users: the job loop retries a refused or failed API call (base 1 s, capped), so that a
thousand jobs under a throttled API server slow down instead of sending a request each every
few seconds; the planner delays a gang restart (10 s, 20 s, 40 s ... capped at 6 min, like
batch/v1 Job's pod failure backoff), so a short network blip cannot use up ``backoffLimit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

RETRY_BASE_SECONDS: Final = 1.0
RETRY_MAX_SECONDS: Final = 300.0
RETRY_JITTER: Final = 0.5
RESTART_BASE_SECONDS: Final = 10.0
RESTART_MAX_SECONDS: Final = 360.0


def exponential(failures: int, base: float, cap: float) -> float:
    """``base * 2**(failures-1)``, capped; 0 before the first failure."""
    if failures <= 0:
        return 0.0
    # 2**64 overflows nothing in float and is far past any cap.
    return min(base * 2.0 ** min(failures - 1, 64), cap)


def jittered(delay: float, fraction: float, rnd: float) -> float:
    """``delay`` stretched by up to ``fraction`` (``rnd`` in [0, 1)), like client-go's Jitter.

    Only ever longer, so with ``fraction`` <= 1 each doubled delay stays longer than the
    previous jittered one: delays keep growing while many clients spread out.
    """
    return delay * (1.0 + fraction * min(max(rnd, 0.0), 1.0))


@dataclass(frozen=True)
class Policy:
    """Base, cap and jitter of one backoff."""

    base: float
    cap: float
    jitter: float = 0.0

    def delay(self, failures: int, rnd: float = 0.0, hint: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure in a row; at least ``hint``
        (the server's Retry-After, itself capped). Jitter applies past the cap too, so jobs
        that all reached the cap still spread out."""
        wait = jittered(exponential(failures, self.base, self.cap), self.jitter, rnd)
        return max(wait, min(hint or 0.0, self.cap))


RETRY: Final = Policy(RETRY_BASE_SECONDS, RETRY_MAX_SECONDS, RETRY_JITTER)
"""Failed API calls, unless the operator's settings say otherwise."""
RESTART: Final = Policy(RESTART_BASE_SECONDS, RESTART_MAX_SECONDS)
"""Gang restarts, unless the operator's settings say otherwise."""
