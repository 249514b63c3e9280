"""A tiny GPT-2 trained by `transformers.Trainer` with `GPUJobCallback`, under torchrun (CPU,
gloo): the integration tests' training script. Random weights from a config; nothing is
downloaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import transformers
from integration_report import report
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from gpujob_trainer.integrations.huggingface import GPUJobCallback

SEQ = 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):
    """Listed before GPUJobCallback: its on_train_end runs while the exporter serves."""

    def __init__(self, out: Path, hold: bool) -> None:
        self.out, self.hold = out, hold

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        facts = {"global_step": state.global_step, "max_steps": state.max_steps}
        report(self.out, facts, self.hold)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--resume")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--linger", type=float, default=0.0, help="serve /metrics after training")
    a = p.parse_args()
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    args = TrainingArguments(
        output_dir=str(a.out / "checkpoints"),
        max_steps=a.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=20,
        save_steps=10,
        include_num_input_tokens_seen=True,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(320),  # 2 ranks x 4 x 2 accumulated: 20 steps an epoch
        eval_dataset=Tokens(16),
        callbacks=[Report(a.out, a.hold), GPUJobCallback(linger=a.linger)],
    )
    trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    main()
