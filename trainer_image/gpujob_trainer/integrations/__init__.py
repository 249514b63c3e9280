"""Callbacks for training frameworks that build the model, loader and optimizer themselves.

    from gpujob_trainer.integrations.huggingface import GPUJobCallback   # transformers.Trainer
    from gpujob_trainer.integrations.lightning import GPUJobCallback     # lightning.pytorch
    from gpujob_trainer.integrations.pytorch_lightning import GPUJobCallback

Each module imports its framework when it is imported itself; `import gpujob_trainer` (and
this package) imports none of them. `common` holds what they share and imports no framework.
"""
