"""The operator's API client: every call bounded in time, every write behind the fence.

A real socket on loopback plays the half-open connection a failover leaves behind: it
accepts and never answers. Before, such a call waited for the kernel (minutes) while
holding the job's lock and a worker thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_operator.runtime.kube import Fenced, Kube, TimedApiClient, object_not_found
from tests.support.waiting import wait_until


class Silent(str):
    """The silent server's URL, and the connections it accepted."""

    held: list[socket.socket]


@pytest.fixture
def silent_server() -> Iterator[Silent]:
    """An HTTP "server" on 127.0.0.1 that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    url = Silent(f"http://127.0.0.1:{srv.getsockname()[1]}")
    url.held = held
    yield url
    stop.set()
    t.join()
    for conn in held:
        conn.close()
    srv.close()


def kube_at(host: str, timeout: float, may_write: bool = True) -> Kube:
    cfg = client.Configuration()
    cfg.host = host
    return Kube(TimedApiClient(cfg, timeout=timeout), may_write=lambda: may_write)


def test_a_call_without_its_own_timeout_gets_the_clients_and_one_retry(
    silent_server: Silent,
) -> None:
    """Bounded: two tries (urllib3 alone would try four times), each within the timeout."""
    kube = kube_at(silent_server, timeout=0.3)
    with pytest.raises(urllib3.exceptions.HTTPError) as err:
        asyncio.run(asyncio.wait_for(kube.get_job("ns", "job"), 30))
    assert "timed out" in str(err.value).lower()
    # The accept thread may lag on a loaded machine: wait for it, then count.
    wait_until(lambda: len(silent_server.held) >= 2, 10, "two connections accepted")
    assert len(silent_server.held) == 2, "one try and one retry, on a fresh connection each"


def test_the_fence_is_checked_again_right_before_a_write_is_sent(silent_server: Silent) -> None:
    """A write queued while the fence was open is not sent once it has shut; reads pass."""
    cfg = client.Configuration()
    cfg.host = silent_server
    shut = TimedApiClient(cfg, timeout=0.3, may_write=lambda: False)
    with pytest.raises(Fenced):
        shut.call_api("PATCH", f"{silent_server}/apis/x", _request_timeout=0.3)
    assert not silent_server.held, "nothing was sent"
    with pytest.raises(urllib3.exceptions.HTTPError):
        shut.call_api("GET", f"{silent_server}/apis/x")


def test_a_call_that_gives_its_own_timeout_keeps_it(silent_server: str) -> None:
    """The hang-evidence write passes its own (shorter) bound; the client's does not widen it."""
    api = TimedApiClient(client.Configuration(), timeout=1000.0)
    seen: dict[str, object] = {}

    def request(*_: object, **kwargs: object) -> None:
        seen.update(kwargs)

    api.rest_client.request = request  # type: ignore[method-assign]
    api.call_api("GET", silent_server, _request_timeout=2.0)
    assert seen["_request_timeout"] == 2.0
    api.call_api("GET", silent_server)
    assert seen["_request_timeout"] == (1000.0, 1000.0)


@pytest.mark.parametrize(
    "write",
    [
        lambda k: k.patch_status("ns", "job", {"phase": "Running"}),
        lambda k: k.create_pod("ns", {"metadata": {"name": "p"}}),
        lambda k: k.delete_pod("ns", "p"),
        lambda k: k.put_configmap("ns", {"metadata": {"name": "c"}, "data": {}}),
    ],
    ids=["patch_status", "create_pod", "delete_pod", "put_configmap"],
)
def test_a_shut_fence_stops_a_write_before_it_is_sent(silent_server: str, write: object) -> None:
    kube = kube_at(silent_server, timeout=0.3, may_write=False)
    with pytest.raises(Fenced):
        asyncio.run(write(kube))  # type: ignore[operator]


def test_a_dry_run_passes_a_shut_fence_and_ends_within_its_own_bound(
    silent_server: Silent,
) -> None:
    """The admission webhook's dry run changes nothing, so a standby replica may send it;
    a silent server cannot hold it past its bound (retries included)."""
    kube = kube_at(silent_server, timeout=1000.0, may_write=False)
    with pytest.raises((TimeoutError, urllib3.exceptions.HTTPError)):
        asyncio.run(asyncio.wait_for(kube.dry_run_pod("ns", {"metadata": {"name": "p"}}, 0.3), 30))
    wait_until(lambda: len(silent_server.held) >= 1, 10, "the dry run was sent")


def test_only_the_servers_notfound_of_an_object_means_it_does_not_exist() -> None:
    """A Workload read answers 404 also when Kueue's API is not served any more (its CRD
    removed, its version dropped): that must not read as "the Workload was deleted"."""
    missing = ApiException(status=404, reason="Not Found")
    missing.body = (
        '{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,'
        '"message":"workloads.kueue.x-k8s.io \\"job-bert\\" not found",'
        '"details":{"name":"job-bert","group":"kueue.x-k8s.io","kind":"workloads"}}'
    )
    unserved = ApiException(status=404, reason="Not Found")
    unserved.body = "404 page not found\n"
    assert object_not_found(missing)
    assert not object_not_found(unserved)
