"""When the kubelet replaces a projected token, and what it asks the TokenRequest API for."""

from __future__ import annotations

from gpujob_localcluster import tokens
from gpujob_localcluster.volumes import TokenSource


def test_refresh_at_80_percent_of_the_requested_lifetime() -> None:
    assert tokens.refresh_after(3607) == 0.8 * 3607
    assert not tokens.refresh_due(100.0, 600, 100.0 + 479)
    assert tokens.refresh_due(100.0, 600, 100.0 + 480)


def test_refresh_at_least_daily() -> None:
    assert tokens.refresh_after(7 * 24 * 3600) == 24 * 3600


def test_request_is_bound_to_the_pod_and_keeps_the_audience() -> None:
    body = tokens.token_request(TokenSource("token", None, 3607), "p", "uid-1")
    spec = body["spec"]
    assert spec["boundObjectRef"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "uid": "uid-1",
    }
    assert spec["expirationSeconds"] == 3607 and "audiences" not in spec
    vault = tokens.token_request(TokenSource("t", "vault", 600), "p", "u")
    assert vault["spec"]["audiences"] == ["vault"]
