"""json_copy: a deep copy of JSON-shaped data, whatever types it meets."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict

from gpujob_operator.api.jsoncopy import json_copy


class Phase(enum.StrEnum):
    RUNNING = "Running"


def test_the_copy_is_equal_and_shares_nothing_mutable() -> None:
    status = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "progress": {"step": 10, "percent": 12.5, "eta": None, "done": False},
        "ranks": [[0, 1], [2, 3]],
    }
    copied = json_copy(status)
    assert copied == status
    copied["conditions"][0]["status"] = "False"
    copied["progress"]["step"] = 11
    copied["ranks"][1].append(4)
    assert status["conditions"][0]["status"] == "True"
    assert status["progress"]["step"] == 10 and status["ranks"][1] == [2, 3]


def test_a_nan_survives_the_copy() -> None:
    assert math.isnan(json_copy({"x": math.nan})["x"])


def test_types_marshal_refuses_are_still_copied_deeply_and_kept() -> None:
    body = OrderedDict(phase=Phase.RUNNING, nested={"a": [1]})
    copied = json_copy(body)
    assert type(copied) is OrderedDict and copied["phase"] is Phase.RUNNING
    copied["nested"]["a"].append(2)
    assert body["nested"]["a"] == [1]
