"""Fault points end the process only when the settings (from the environment) name them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpujob_operator.runtime import faults

CALL = (
    "import os; from gpujob_operator.runtime.faults import fault_point; "
    "from gpujob_operator.runtime.settings import from_env; "
    "fault_point(from_env(os.environ).fault_exit_at, {!r}); print('passed')"
)


@pytest.mark.parametrize(
    ("env", "point", "code"),
    [
        (None, faults.AFTER_STATUS_WRITE, 0),
        (faults.BETWEEN_POD_DELETES, faults.AFTER_STATUS_WRITE, 0),
        (faults.BETWEEN_POD_DELETES, faults.BETWEEN_POD_DELETES, faults.EXIT_CODE),
    ],
)
def test_fault_point_exits_137_only_at_the_named_boundary(
    env: str | None, point: str, code: int
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if env is not None:
        environ[faults.ENV] = env
    res = subprocess.run(
        [sys.executable, "-c", CALL.format(point)], env=environ, capture_output=True, text=True
    )
    assert res.returncode == code, res.stderr
    assert ("passed" in res.stdout) == (code == 0)
    if code:
        assert f"exiting at {point}" in res.stderr
