"""Training: the pretraining and fine-tuning loops (``pretrain``, ``finetune``), their typed
configs (``config``), what pretraining sets up before its first step (``setup``), the parts of an
optimizer step both loops share (``steps``), the optimizer and schedule (``optim``) and a run's
checkpoints and train state on disk (``checkpoints``)."""

from bertforge.training.config import FinetuneConfig, LoopOptions, PretrainConfig, TrainConfig
from bertforge.training.finetune import finetune
from bertforge.training.pretrain import pretrain

__all__ = ["FinetuneConfig", "LoopOptions", "PretrainConfig", "TrainConfig", "finetune", "pretrain"]
