"""Who this process is and where it serves, read from the env torchrun and the operator set."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpujob_trainer import contract


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not an integer") from exc


@dataclass(frozen=True)
class RankInfo:
    """The identity a rank's series carry (labels) and its place in the job."""

    rank: int = 0
    local_rank: int = 0
    node_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankInfo:
        """Read torchrun's variables; a plain `python train.py` is rank 0 of 1."""
        env = os.environ if env is None else env
        node_rank = _int(env, contract.ENV_GROUP_RANK, None)
        for name in contract.ENV_NODE_RANK_FALLBACKS:
            if node_rank is None:
                node_rank = _int(env, name, None)
        return cls(
            rank=_int(env, contract.ENV_RANK, 0) or 0,
            local_rank=_int(env, contract.ENV_LOCAL_RANK, 0) or 0,
            node_rank=node_rank or 0,
            world_size=_int(env, contract.ENV_WORLD_SIZE, 1) or 1,
        )

    def labels(self) -> dict[str, str]:
        """The rank labels of the contract, as strings."""
        return {
            contract.LABEL_RANK: str(self.rank),
            contract.LABEL_LOCAL_RANK: str(self.local_rank),
            contract.LABEL_NODE_RANK: str(self.node_rank),
        }


def total_steps_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The job's target step count, when the operator set one."""
    env = os.environ if env is None else env
    value = _int(env, contract.ENV_TOTAL_STEPS, None)
    if value is not None and value < 0:
        raise ValueError(f"{contract.ENV_TOTAL_STEPS} must be >= 0, got {value}")
    return value


def metrics_base_port(env: Mapping[str, str] | None = None) -> int:
    """The base exporter port (rank serves on base + LOCAL_RANK)."""
    env = os.environ if env is None else env
    port = _int(env, contract.ENV_METRICS_PORT, contract.DEFAULT_METRICS_PORT)
    assert port is not None
    if not 0 <= port <= 65535:
        raise ValueError(f"{contract.ENV_METRICS_PORT}={port} is not a port")
    return port


def metrics_addr(env: Mapping[str, str] | None = None) -> str:
    """The address the exporter binds: all interfaces unless overridden."""
    env = os.environ if env is None else env
    return env.get(contract.ENV_METRICS_ADDR, "").strip() or "0.0.0.0"


def endpoint_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token ``/debug/*`` requires (None: no token, the path is open to whoever reaches it)."""
    env = os.environ if env is None else env
    return env.get(contract.ENV_ENDPOINT_TOKEN, "").strip() or None
