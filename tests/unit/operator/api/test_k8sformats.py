"""The Python twins of the API server's formats and quantities (tests/support/format_cases.py).

The integration tests run the same table through the API server's CEL rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import k8sformats as kf
from tests.support.format_cases import all_cases, job_with


@pytest.mark.parametrize(("kind", "value", "valid"), all_cases(), ids=repr)
def test_the_model_judges_each_format_like_core_v1(kind: str, value: Any, valid: bool) -> None:
    body = job_with(kind, value)
    if valid:
        api.GPUTrainingJob.model_validate(body)
    else:
        with pytest.raises(ValidationError):
            api.GPUTrainingJob.model_validate(body)


def test_formats_directly() -> None:
    assert kf.is_qualified_name("example.com/a_b.c-d")
    assert not kf.is_qualified_name("")
    assert kf.is_label_value("") and not kf.is_label_value("a" * 64)
    assert kf.is_dns1123_label("a-1") and not kf.is_dns1123_label("a.1")
    assert kf.is_dns1123_subdomain("a.b") and not kf.is_dns1123_subdomain("a..b")
    assert kf.is_config_key("settings.json") and not kf.is_config_key("a/b")
    assert kf.is_env_name("A B") and not kf.is_env_name("") and not kf.is_env_name("A=B")
