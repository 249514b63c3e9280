"""Tricky values for each string format the API checks, with what core/v1 says of them.

The unit tests run them through the pydantic model and the integration tests through the
API server's CEL rules: both must agree with this table, so the two twins agree with each
other on the edge cases (lengths, empty parts, case, signs, suffixes).
"""

from __future__ import annotations

from typing import Any, Final

LONG_SUBDOMAIN: Final = ".".join(["a" * 63] * 4)  # 255 characters

CASES: Final[dict[str, dict[Any, bool]]] = {
    "label value": {
        "": True,
        "a": True,
        "ML.research_1-0": True,
        "a" * 63: True,
        "-a": False,
        "a_": False,
        "a b": False,
        "ü": False,
        "a/b": False,
    },
    "qualified name": {
        "a": True,
        "nvidia.com/gpu": True,
        "node-role.kubernetes.io/Worker_1": True,
        "a" * 63: True,
        "a" * 64: False,
        "Example.com/gpu": False,
        "example.com/": False,
        "/gpu": False,
        "a/b/c": False,
        "gpu!": False,
        "_gpu": False,
    },
    "quantity": {
        "0": True,
        "1": True,
        2: True,
        "500m": True,
        "1.5": True,
        ".5": True,
        "1.": True,
        "+1": True,
        "16Gi": True,
        "2E": True,
        "1e3": True,
        "1E-3": True,
        "1.5Gi": True,
        "1.G": True,
        "1e+3": True,
        "Mi": True,  # the server reads a bare suffix as 0 (ParseQuantity), so do we
        "-": True,
        "-1": False,
        -1: False,
        "1ki": False,
        "1Mb": False,
        " 1": False,
        "1 ": False,
        "1.1.1": False,
        "0x10": False,
        "1e": False,
        "1ee3": False,
        "1e2.5": False,
        "1e99999999999": False,
        "1e999": True,
        "1E-999": True,
        "1e1000": False,  # the API server's parser would spend seconds on a longer exponent
        "1e+0999": False,
        "1e10000000": False,
        "two": False,
        "": False,
    },
    "extended resource amount": {
        "2": True,
        3: True,
        "1000m": True,
        "1.0": True,
        "1Ki": True,
        "1e3": True,
        "1500m": False,
        "0.5": False,
        "100E": False,
    },
    "dns subdomain": {
        "a": True,
        "trainer-sa": True,
        "a.b-c.d": True,
        "a" * 253: True,
        "a" * 254: False,
        LONG_SUBDOMAIN: False,
        "A": False,
        "a..b": False,
        "-a": False,
        "a.": False,
        "a_b": False,
    },
    "dns label": {
        "a": True,
        "data-1": True,
        "1data": True,
        "a" * 63: True,
        "a" * 64: False,
        "Data": False,
        "a.b": False,
        "a-": False,
    },
    "env name": {
        "A": True,
        "a.b-c": True,
        "with space": True,
        "1ST": True,
        "A=B": False,
        "tab\there": False,
        "é": False,
    },
}


def job_with(kind: str, value: Any, name: str = "format-case") -> dict[str, Any]:
    """A job whose only questionable part is ``value`` in a field of format ``kind``."""
    spec: dict[str, Any] = {
        "image": "gpujob-trainer:0.1.0",
        "command": ["python", "-m", "gpujob_trainer.example"],
    }
    if kind == "label value":
        spec["template"] = {"labels": {"team": value}}
    elif kind == "qualified name":
        spec["template"] = {"tolerations": [{"key": value, "operator": "Exists"}]}
    elif kind == "quantity":
        spec["resources"] = {"requests": {"cpu": value}}
    elif kind == "extended resource amount":
        spec["resources"] = {
            "requests": {"example.com/fpga": value},
            "limits": {"example.com/fpga": value},
        }
    elif kind == "dns subdomain":
        spec["template"] = {"serviceAccountName": value}
    elif kind == "dns label":
        spec["template"] = {"volumes": [{"name": value, "emptyDir": {}}]}
    elif kind == "env name":
        spec["env"] = [{"name": value, "value": "1"}]
    else:
        raise ValueError(kind)
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def all_cases() -> list[tuple[str, Any, bool]]:
    """(kind, value, valid) for every case, in a stable order."""
    return [(kind, value, ok) for kind, table in CASES.items() for value, ok in table.items()]
