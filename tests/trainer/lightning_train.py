"""A tiny LightningModule trained by `lightning.pytorch.Trainer` (DDP, CPU, gloo) with
`GPUJobCallback`, under torchrun: the integration tests' training script."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from integration_report import report
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from gpujob_trainer.integrations.lightning import GPUJobCallback

BATCH = 4


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data(n: int) -> torch.utils.data.DataLoader[Any]:
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    dataset = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH)


class Report(L.Callback):
    """Listed before GPUJobCallback: its on_train_end runs while the exporter serves."""

    def __init__(self, out: Path, hold: bool) -> None:
        self.out, self.hold = out, hold

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        facts = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
        report(self.out, facts, self.hold)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--resume")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--linger", type=float, default=0.0, help="serve /metrics after training")
    p.add_argument("--no-callback", action="store_true", help="leave it to the entry point")
    a = p.parse_args()
    ours = [] if a.no_callback else [GPUJobCallback(linger=a.linger)]
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_steps=a.steps,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        accumulate_grad_batches=2,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[
            Report(a.out, a.hold),
            *ours,
            ModelCheckpoint(dirpath=a.out / "checkpoints", every_n_train_steps=10, save_top_k=-1),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # 160 samples: 20 batches a rank, 10 optimizer steps an epoch (validation at its end)
    trainer.fit(Regression(), data(160), data(16), ckpt_path=a.resume)


if __name__ == "__main__":
    main()
