"""What every status model shares: the timestamp type and lenient reading.

A leaf under :mod:`.status` and :mod:`.operatorstate`, so the user's contract and the
operator's bookkeeping are built from the same parts without importing each other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import ConfigDict, PlainSerializer, WithJsonSchema

from gpujob_operator.api.base import Model
from gpujob_operator.api.conditions import format_time

Time = Annotated[
    datetime,
    PlainSerializer(format_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A timestamp, written as RFC 3339 UTC with a Z, like Kubernetes' metav1.Time."""


class StatusModel(Model):
    """Base for status models: unknown fields ignored so an older operator can read."""

    model_config = ConfigDict(extra="ignore")
