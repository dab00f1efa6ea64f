"""Training behind ``txl train``: :class:`Trainer`, :func:`train` (see :mod:`txl.train.trainer`).

Validation and the final test use :func:`txl.evaluate.evaluate` (the one scoring with memory).
Submodules: ``trainer`` (the loop and its state), ``distributed``
(``torchrun`` processes), ``metrics`` (``metrics.jsonl``, TensorBoard, progress bar). Configuration is
:class:`txl.train_config.TrainConfig`; schedules are in :mod:`txl.schedule`, checkpoints in
:mod:`txl.checkpoint`.
"""

from txl.train.trainer import Trainer, TrainingDiverged, find_resume_checkpoint, train
from txl.train_config import TrainConfig

__all__ = ["TrainConfig", "Trainer", "TrainingDiverged", "find_resume_checkpoint", "train"]
