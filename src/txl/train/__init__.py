"""Training behind ``txl train``: :class:`Trainer`, :func:`train`, :func:`evaluate` (see :mod:`txl.train.trainer`).

Submodules: ``trainer`` (the loop and its state), ``evaluate`` (scoring with memory), ``distributed``
(``torchrun`` processes), ``metrics`` (``metrics.jsonl``, TensorBoard, progress bar). Configuration is
:class:`txl.train_config.TrainConfig`; schedules are in :mod:`txl.schedule`, checkpoints in
:mod:`txl.checkpoint`.
"""

from txl.train.evaluate import evaluate
from txl.train.trainer import Trainer, TrainingDiverged, find_resume_checkpoint, train
from txl.train_config import TrainConfig

__all__ = ["TrainConfig", "Trainer", "TrainingDiverged", "evaluate", "find_resume_checkpoint", "train"]
