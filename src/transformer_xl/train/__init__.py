"""Training behind ``txl train``: :class:`Trainer` and :func:`train` (official ``train.py`` semantics).

==============  ==============================================================================
module          what it holds
==============  ==============================================================================
``config``      :class:`TrainConfig`: validation, JSON/TOML, flags
``presets``     the official run scripts (and small CPU recipes) as functions
``schedule``    optimizers and learning-rate schedules of the official ``train.py``
``trainer``     :class:`Trainer`: the loop, chunked accumulation, DDP, AMP, non-finite guard, state
``batches``     the training batches of a process (resumable)
``validation``  validation and the final evaluation with the official lengths
``state``       the state a checkpoint holds (counters, memories, RNG states of every process)
``resume``      what ``--resume`` may change; the checks before a resumed run touches its directory
``distributed`` ``torchrun`` processes (gloo on CPU, NCCL on GPU)
``signals``     SIGTERM/Ctrl-C stop after the step, saving a checkpoint
``metrics``     ``metrics.jsonl``, TensorBoard, the progress bar, the run's files and best/final models
``plot``        learning curves of a run directory (``txl plot``)
==============  ==============================================================================
"""

from transformer_xl.train.config import TrainConfig
from transformer_xl.train.resume import plan_resume
from transformer_xl.train.trainer import Trainer, TrainingDiverged, train

__all__ = ["TrainConfig", "Trainer", "TrainingDiverged", "plan_resume", "train"]
