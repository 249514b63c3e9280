"""`GPUJobCallback` for Lightning (`lightning.pytorch`); see `lightning_hooks` for what it
measures.

    trainer = lightning.pytorch.Trainer(..., callbacks=[GPUJobCallback()])
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from gpujob_trainer.integrations.lightning_hooks import LightningHooks

__all__ = ["GPUJobCallback"]


class GPUJobCallback(LightningHooks, Callback):
    """Reports a `lightning.pytorch.Trainer`'s steps, phases, samples and loss to gpujob."""
