"""Fine-tuning on Hugging Face Accelerate."""

from skillgraft.train.finetune import FinetuneConfig, FinetuneResult, batch_schedule, finetune
from skillgraft.train.run import run_finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "batch_schedule", "finetune", "run_finetune"]
