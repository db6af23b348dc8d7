"""Fine-tuning on Hugging Face Accelerate: one training core (:func:`fit`) with callbacks and batch samplers."""

from skillgraft.lazy import lazy_exports
from skillgraft.train.finetune import FinetuneResult, finetune  # a function named as its module: bound here, once

# each name’s module is imported on first use (``import skillgraft.train.x`` runs no sibling)
_EXPORTS = {
    "AutoRGN": "skillgraft.train.callbacks",
    "BestDev": "skillgraft.train.callbacks",
    "Callback": "skillgraft.train.callbacks",
    "RegionMask": "skillgraft.train.callbacks",
    "Snapshots": "skillgraft.train.callbacks",
    "FinetuneConfig": "skillgraft.train.config",
    "TrainResult": "skillgraft.train.core",
    "TrainState": "skillgraft.train.core",
    "fit": "skillgraft.train.core",
    "freeze_unused": "skillgraft.train.core",
    "run_finetune": "skillgraft.train.run",
    "MultiTask": "skillgraft.train.samplers",
    "SingleTask": "skillgraft.train.samplers",
    "batch_schedule": "skillgraft.train.samplers",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["AutoRGN", "BestDev", "Callback", "FinetuneConfig", "FinetuneResult", "MultiTask", "RegionMask",
           "SingleTask", "Snapshots", "TrainResult", "TrainState", "batch_schedule", "finetune", "fit",
           "freeze_unused", "run_finetune"]
