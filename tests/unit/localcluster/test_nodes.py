"""Each local node has a loopback address of its own (hostNetwork pods take it)."""

from __future__ import annotations

import pytest

from gpujob_localcluster.nodes import node_addresses


def test_node_addresses_are_distinct_and_above_the_pods_range() -> None:
    ips = node_addresses(3, 7)
    assert ips == ["127.255.7.1", "127.255.7.2", "127.255.7.3"]
    assert len(set(ips)) == 3


@pytest.mark.parametrize(("count", "octet"), [(0, 1), (255, 1), (2, 255), (2, -1)])
def test_node_addresses_refuse_what_does_not_fit(count: int, octet: int) -> None:
    with pytest.raises(ValueError, match="no node addresses"):
        node_addresses(count, octet)
