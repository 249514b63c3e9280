"""`GPUJobCallback` for the older `pytorch_lightning` namespace; see `lightning_hooks`.

trainer = pytorch_lightning.Trainer(..., callbacks=[GPUJobCallback()])
"""

from __future__ import annotations

from pytorch_lightning.callbacks import Callback

from gpujob_trainer.integrations.lightning_hooks import LightningHooks, from_env

__all__ = ["GPUJobCallback", "callbacks_from_env"]


class GPUJobCallback(LightningHooks, Callback):
    """Reports a `pytorch_lightning.Trainer`'s steps, phases, samples and loss to gpujob."""


def callbacks_from_env() -> list[LightningHooks]:
    """The `pytorch_lightning.callbacks_factory` entry point (see `lightning_hooks.from_env`)."""
    return from_env(GPUJobCallback)
