"""`GPUJobCallback` for the older `pytorch_lightning` namespace; see `lightning_hooks`.

trainer = pytorch_lightning.Trainer(..., callbacks=[GPUJobCallback()])
"""

from __future__ import annotations

from pytorch_lightning.callbacks import Callback

from gpujob_trainer.integrations.lightning_hooks import LightningHooks

__all__ = ["GPUJobCallback"]


class GPUJobCallback(LightningHooks, Callback):
    """Reports a `pytorch_lightning.Trainer`'s steps, phases, samples and loss to gpujob."""
