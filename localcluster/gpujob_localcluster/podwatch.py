"""The pod feed a kubelet stand-in reads: list, then watch, relisting after a broken watch.

The node agent and the hollow kubelet both run one in a thread and take its events from a
queue: ``("pod", body)`` for an added or changed pod, ``("deleted", body)``, and after each
listing ``("resync", uids)`` with every pod it listed (what is not there is gone).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("gpujob.podwatch")


def watch_pods(
    core: client.CoreV1Api,
    events: queue.Queue[tuple[str, Any]],
    stopping: threading.Event,
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> None:
    """Feed every pod (those ``keep`` accepts) into ``events`` until ``stopping``."""
    while not stopping.is_set():
        try:
            resp: Any = core.list_pod_for_all_namespaces(_preload_content=False)
            listing = json.loads(resp.data)
            seen = set()
            for item in listing["items"]:
                if keep is None or keep(item):
                    seen.add(item["metadata"]["uid"])
                    events.put(("pod", item))
            events.put(("resync", seen))
            version = listing["metadata"]["resourceVersion"]
            del listing, resp
            resp = core.list_pod_for_all_namespaces(
                watch=True,
                resource_version=version,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
            try:
                _feed(resp, events, stopping, keep)
            finally:
                resp.close()
                resp.release_conn()
        except Exception as e:
            if not stopping.is_set():
                log.warning("pod watch broke (%s); relisting", e)
                stopping.wait(1.0)


def _feed(
    resp: Any,
    events: queue.Queue[tuple[str, Any]],
    stopping: threading.Event,
    keep: Callable[[dict[str, Any]], bool] | None,
) -> None:
    """The watch's events as JSON, never decoded into the client's models: with a 400 KB
    pod template, 512 hollow pods' events decoded (and re-encoded) by the client's watch
    held one thread of a 2-core machine for tens of seconds in a gang restart, where 512
    real kubelets would each read their own pod."""
    for line in iter_resp_lines(resp):
        if stopping.is_set():
            return
        if not line:
            continue
        ev = json.loads(line)
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch ended: {obj.get('message', obj)}")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or (keep and not keep(obj)):
            continue
        events.put(("deleted" if kind == "DELETED" else "pod", obj))
