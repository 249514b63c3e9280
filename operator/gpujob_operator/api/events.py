"""The Kubernetes Events the operator posts on a job, as plain data (pure).

The planner and the monitor decide Events; the runtime posts them. One type for both, so
the runtime has one way to post and tests one shape to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job: its type, a CamelCase reason, a message."""

    type: EventType
    reason: str
    message: str
