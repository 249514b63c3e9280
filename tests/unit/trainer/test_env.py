"""Reading rank identity, target steps and the metrics port from the env."""

from __future__ import annotations

import pytest

from gpujob_trainer.env import RankInfo, metrics_addr, metrics_base_port, total_steps_from_env


def test_rank_info_from_torchrun_env() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2"}
    info = RankInfo.from_env(env)
    assert info == RankInfo(rank=5, local_rank=1, node_rank=2, world_size=8)
    assert info.labels() == {"rank": "5", "local_rank": "1", "node_rank": "2"}


@pytest.mark.parametrize(
    ("env", "node_rank"),
    [
        ({"PET_NODE_RANK": "3", "NODE_RANK": "4"}, 3),
        ({"NODE_RANK": "4"}, 4),
        ({"GROUP_RANK": "0", "PET_NODE_RANK": "3"}, 0),
        ({}, 0),
    ],
)
def test_node_rank_fallbacks(env: dict[str, str], node_rank: int) -> None:
    assert RankInfo.from_env(env).node_rank == node_rank


def test_plain_python_is_rank_zero_of_one() -> None:
    assert RankInfo.from_env({}) == RankInfo(0, 0, 0, 1)


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not an integer"):
        RankInfo.from_env({"LOCAL_RANK": "x"})


def test_target_steps_and_port() -> None:
    assert total_steps_from_env({}) is None
    assert total_steps_from_env({"GPUJOB_TOTAL_STEPS": "1200"}) == 1200
    with pytest.raises(ValueError, match="GPUJOB_TOTAL_STEPS must be >= 0"):
        total_steps_from_env({"GPUJOB_TOTAL_STEPS": "-1"})
    assert metrics_base_port({}) == 9400
    assert metrics_base_port({"GPUJOB_METRICS_PORT": "9500"}) == 9500
    with pytest.raises(ValueError, match="is not a port"):
        metrics_base_port({"GPUJOB_METRICS_PORT": "70000"})
    assert metrics_addr({}) == "0.0.0.0"
    assert metrics_addr({"GPUJOB_METRICS_ADDR": "127.0.0.1"}) == "127.0.0.1"
