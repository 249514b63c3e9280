"""A rank's hang evidence: the stack of every Python thread and its recent collectives.

Served as JSON on the metrics server's :data:`contract.EVIDENCE_PATH` (off with
``GPUJOB_EVIDENCE=0``) so the operator can compare the ranks of a stalled job before a
restart destroys the one moment that shows why it hung.

* **Stacks** come from ``sys._current_frames()``: a snapshot of every thread's frames, taken
  by the serving thread while training goes on (no signal, no pause). Only file, line and
  function are kept, never local variables, each stack is cut to :data:`MAX_FRAMES` (the
  innermost ones) and the threads to :data:`MAX_THREADS`. A rank whose Python holds the GIL
  in native code cannot answer at all, and the operator reports exactly that.
* **Collectives** come from PyTorch's Flight Recorder, read through its supported dump
  functions in ``torch._C._distributed_c10d``: ``_dump_fr_trace_json`` for gloo (recorded
  when ``TORCH_FR_BUFFER_SIZE`` > 0), ``_dump_nccl_trace_json`` for NCCL (recorded when
  ``TORCH_NCCL_TRACE_BUFFER_SIZE`` or ``TORCH_FR_BUFFER_SIZE`` > 0). The operator sets both
  in the pods; each entry keeps its sequence number, op, sizes and state, the newest
  :data:`MAX_ENTRIES` only. No process group, no recorder, or an older torch: the section
  says why it is empty instead.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Final

from gpujob_trainer import contract

MAX_THREADS: Final = 32
MAX_FRAMES: Final = 40
MAX_ENTRIES: Final = 64
MAX_TEXT: Final = 200
"""Characters kept of a file name or function name (the operator caps again)."""


def enabled() -> bool:
    """Whether the endpoint is served (``GPUJOB_EVIDENCE``, on unless 0/false/off)."""
    value = os.environ.get(contract.ENV_EVIDENCE, "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def _frames(frame: Any) -> list[dict[str, Any]]:
    """Outermost first, at most :data:`MAX_FRAMES` (the innermost are the ones that tell)."""
    out: list[dict[str, Any]] = []
    while frame is not None:
        code = frame.f_code
        out.append(
            {
                "file": str(code.co_filename)[-MAX_TEXT:],
                "line": int(frame.f_lineno or 0),
                "function": str(code.co_name)[:MAX_TEXT],
            }
        )
        frame = frame.f_back
    out.reverse()
    return out[-MAX_FRAMES:]


def stacks() -> list[dict[str, Any]]:
    """Every thread's stack but the caller's (the server thread tells nothing)."""
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        thread = names.get(ident)
        out.append(
            {
                "name": (thread.name if thread else f"thread-{ident}")[:MAX_TEXT],
                "main": ident == main,
                "daemon": bool(thread.daemon) if thread else False,
                "frames": _frames(frame),
            }
        )
    out.sort(key=lambda t: (not t["main"], t["name"]))
    return out[:MAX_THREADS]


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    pg = raw.get("process_group") or ["", ""]
    name = str(raw.get("profiling_name") or "")
    return {
        "seq": int(raw.get("collective_seq_id") or 0),
        "p2pSeq": int(raw.get("p2p_seq_id") or 0),
        "op": name.split(":", 1)[-1][:MAX_TEXT],
        "pg": str(pg[1] if len(pg) > 1 else pg[0])[:MAX_TEXT],
        "pgId": str(raw.get("pg_id", ""))[:MAX_TEXT],
        "state": str(raw.get("state") or "")[:32],
        "retired": bool(raw.get("retired")),
        "sizes": [list(s)[:8] for s in (raw.get("input_sizes") or [])[:8]],
        "dtypes": [str(d)[:16] for d in (raw.get("input_dtypes") or [])[:8]],
        "p2p": bool(raw.get("is_p2p")),
    }


def collectives() -> dict[str, Any]:
    """The Flight Recorder's view of this rank's collectives, or why there is none."""
    if "torch.distributed" not in sys.modules:  # never import torch just to answer
        return {"available": False, "why": "torch.distributed is not in use"}
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return {"available": False, "why": "no process group initialised"}
    backend = str(dist.get_backend())
    names = {"nccl": "_dump_nccl_trace_json", "gloo": "_dump_fr_trace_json"}
    if backend not in names:
        return {"available": False, "backend": backend, "why": f"no recorder for {backend}"}
    try:
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, names[backend], None)
        if dump is None:
            why = f"this torch has no {names[backend]} (an older release)"
            return {"available": False, "backend": backend, "why": why}
        raw = dump(includeCollectives=True, onlyActive=False)
        data = json.loads(raw)
        entries = [_entry(e) for e in (data.get("entries") or [])[-MAX_ENTRIES:]]
        status = {
            str(pg)[:MAX_TEXT]: {
                k: int(v)
                for k, v in (s or {}).items()
                if k.startswith("last_") and str(v).lstrip("-").isdigit()
            }
            for pg, s in list((data.get("pg_status") or {}).items())[:16]
        }
    except Exception as exc:  # no recorder in this build, or a dump of another shape: the
        # stacks are still worth serving, so the collectives only say why they are missing
        why = f"{type(exc).__name__}: {str(exc)[:MAX_TEXT]}"
        return {"available": False, "backend": backend, "why": why}
    if not entries:
        why = "the recorder holds no entry (TORCH_FR_BUFFER_SIZE unset or 0?)"
        return {"available": False, "backend": backend, "why": why, "pgStatus": status}
    return {"available": True, "backend": backend, "entries": entries, "pgStatus": status}


def snapshot(rank: int | None) -> dict[str, Any]:
    """The whole evidence document of this rank (see the module docstring)."""
    return {
        "version": 1,
        "rank": rank,
        "pid": os.getpid(),
        "time": time.time(),
        "threads": stacks(),
        "collectives": collectives(),
    }


def render(rank: int | None) -> bytes:
    """:func:`snapshot` as JSON bytes; a failure is itself reported, never raised."""
    try:
        return json.dumps(snapshot(rank), separators=(",", ":")).encode()
    except Exception as exc:
        return json.dumps({"version": 1, "rank": rank, "error": repr(exc)[:MAX_TEXT]}).encode()
