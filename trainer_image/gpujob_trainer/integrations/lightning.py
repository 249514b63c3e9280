"""`GPUJobCallback` for Lightning (`lightning.pytorch`); see `lightning_hooks` for what it
measures.

    trainer = lightning.pytorch.Trainer(..., callbacks=[GPUJobCallback()])
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from gpujob_trainer.integrations.lightning_hooks import LightningHooks, from_env

__all__ = ["GPUJobCallback", "callbacks_from_env"]


class GPUJobCallback(LightningHooks, Callback):
    """Reports a `lightning.pytorch.Trainer`'s steps, phases, samples and loss to gpujob."""


def callbacks_from_env() -> list[LightningHooks]:
    """The `lightning.pytorch.callbacks_factory` entry point (see `lightning_hooks.from_env`)."""
    return from_env(GPUJobCallback)
