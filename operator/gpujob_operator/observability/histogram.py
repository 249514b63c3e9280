"""A Prometheus histogram's state, kept by hand: cumulative buckets, sum and count.

The operator's collectors render their histograms from it at scrape time. It takes no lock:
an owner that needs one holds its own (the gc callback cannot take any).
"""

from __future__ import annotations


class Histogram:
    """Counts per bucket (the last one +Inf) and the sum of what was observed."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, as a Prometheus histogram renders them."""
        out, running = [], 0
        counts = list(self.counts)
        for b, c in zip([*(repr(float(b)) for b in self.bounds), "+Inf"], counts, strict=True):
            running += c
            out.append((b, float(running)))
        return out
