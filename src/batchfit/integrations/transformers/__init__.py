"""The Hugging Face Trainer with its batch sizes fitted by batchfit, in place of
``auto_find_batch_size`` (``pip install 'batchfit[transformers]'``): ``BatchfitTrainer`` (or
``BatchfitMixin`` before your own Trainer class) searches the Trainer's own step, keeps the global
batch through an out-of-memory, and records its plan in each checkpoint; ``NoiseScaleMixin`` (or
``NoiseScaleTrainer``) logs the gradient noise scale as it trains (docs/integrations.md)."""

from batchfit.integrations.transformers.fitting import PLAN_FILE, TrainerPlan
from batchfit.integrations.transformers.loss_weights import LossReductionError
from batchfit.integrations.transformers.noise_scale import NoiseScaleMixin, NoiseScaleTrainer
from batchfit.integrations.transformers.trainer import BatchfitMixin, BatchfitTrainer

__all__ = [
    "PLAN_FILE",
    "BatchfitMixin",
    "BatchfitTrainer",
    "LossReductionError",
    "NoiseScaleMixin",
    "NoiseScaleTrainer",
    "TrainerPlan",
]
