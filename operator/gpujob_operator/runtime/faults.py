"""Fault injection for tests: die at a named write boundary, as a crash or OOM kill would.

The chaos and integration tests start the operator with ``GPUJOB_FAULT_EXIT_AT=<boundary>``
(read once at start-up into the settings, which hand it to each job loop as ``armed``) and
the process ends with exit code 137 (SIGKILL's) the first time it reaches that boundary,
with no cleanup, no flush and no graceful shutdown: exactly the states a real crash leaves.
Unarmed (always, in production) a fault point costs one comparison.

Boundaries of a gang restart, in the order the job loop writes:
``after-status-write`` (status written, pods not yet touched), ``between-pod-deletes``,
``between-pod-creates``; of an in-place restart, ``between-pod-patches`` (after the first pod
moved to the next attempt, before the rest). Apart from those, ``before-evidence-record``: a stall's hang evidence
taken and its ConfigMap written, its record not yet in the status.
"""

from __future__ import annotations

import os
import sys
from typing import Final

ENV: Final = "GPUJOB_FAULT_EXIT_AT"
EXIT_CODE: Final = 137
AFTER_STATUS_WRITE: Final = "after-status-write"
BETWEEN_POD_DELETES: Final = "between-pod-deletes"
BETWEEN_POD_CREATES: Final = "between-pod-creates"
BETWEEN_POD_PATCHES: Final = "between-pod-patches"
BOUNDARIES: Final = (AFTER_STATUS_WRITE, BETWEEN_POD_DELETES, BETWEEN_POD_CREATES)
"""The boundaries of a Recreate restart."""
IN_PLACE_BOUNDARIES: Final = (AFTER_STATUS_WRITE, BETWEEN_POD_PATCHES)
"""The boundaries of an in-place restart."""
BEFORE_EVIDENCE_RECORD: Final = "before-evidence-record"
POINTS: Final = (*BOUNDARIES, BETWEEN_POD_PATCHES, BEFORE_EVIDENCE_RECORD)
"""Every point a test may arm."""


def fault_point(armed: str | None, name: str) -> None:
    """Exit the process at once (code 137) when the armed boundary is this point."""
    if armed == name:
        sys.stderr.write(f"gpujob fault injection: exiting at {name}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
