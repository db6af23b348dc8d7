"""Fine-tuning on Hugging Face Accelerate: one training core (:func:`fit`) with callbacks and batch samplers."""

from skillgraft.train.callbacks import AutoRGN, BestDev, Callback, RegionMask, Snapshots
from skillgraft.train.config import FinetuneConfig
from skillgraft.train.core import TrainResult, TrainState, fit, freeze_unused
from skillgraft.train.finetune import FinetuneResult, finetune
from skillgraft.train.run import run_finetune
from skillgraft.train.samplers import MultiTask, SingleTask, batch_schedule

__all__ = ["AutoRGN", "BestDev", "Callback", "FinetuneConfig", "FinetuneResult", "MultiTask", "RegionMask",
           "SingleTask", "Snapshots", "TrainResult", "TrainState", "batch_schedule", "finetune", "fit",
           "freeze_unused", "run_finetune"]
