"""Training: one loop for every objective, checkpoints that never lose work, multi-process training.

* :class:`Trainer`: the loop (validation, early stopping, schedules, clipping, auxiliary losses,
  NaN guard, progress, metrics history, atomic checkpoints, exact resume, DDP);
* objectives: :class:`MaximumLikelihood` (data), :class:`WeightedSum` (mixtures), and the
  :class:`Objective` protocol for your own; energy targets (:mod:`flows.train.energy`):
  :class:`ReverseKL` (with temperature and :class:`AnnealTemperature`), :class:`ForwardKL` on
  reference or exact samples, :class:`ImportanceForwardKL` (from the model's own samples, with
  mode-jumping moves);
* flow matching of continuous flows (:mod:`flows.train.flow_matching`): :class:`FlowMatching`
  (conditional flow matching with noise level σ, independent or minibatch-OT couplings);
* regression onto latent–data pairs (:mod:`flows.train.regression`): :class:`PairRegression`
  (FORT / RegFlow; pairs from :mod:`flows.train.pairs`);
* callbacks: :class:`CosineDecay`, :class:`EarlyStopping`, :class:`MetricsLogger`, :class:`PrintMetrics`,
  :class:`RecordNFE`;
* checkpoints: :func:`save_checkpoint`, :func:`load_checkpoint` (the training state, with the
  model config of :func:`flows.model_file.describe_model` in the header; models themselves are
  saved with :func:`flows.save_model` and rebuilt with :func:`flows.load_model`);
* :mod:`flows.train.distributed`: ``torch.distributed`` helpers;
* representation alignment of TarFlows with a frozen encoder (REPA / FlowBack):
  :class:`RepresentationAlignment`.
"""

from flows.train._lock import RunLockedError
from flows.train.alignment import RepresentationAlignment
from flows.train.callbacks import Callback, CosineDecay, EarlyStopping, MetricsLogger, PrintMetrics, RecordNFE
from flows.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from flows.train.energy import (
    AnnealTemperature,
    ForwardKL,
    ImportanceForwardKL,
    ReverseKL,
    annealed_temperature,
    forward_kl_loss,
    reverse_kl_loss,
)
from flows.train.flow_matching import FlowMatching
from flows.train.guard import NonFiniteGuard, TrainingDiverged, TrainingWarning
from flows.train.history import History
from flows.train.injective import FreeFormInjectiveObjective
from flows.train.objectives import MaximumLikelihood, Objective, WeightedSum
from flows.train.regression import PairRegression, pair_regression_loss
from flows.train.trainer import Trainer, default_optimizer

__all__ = [
    "AnnealTemperature",
    "Callback",
    "Checkpoint",
    "CheckpointError",
    "CosineDecay",
    "EarlyStopping",
    "FlowMatching",
    "ForwardKL",
    "FreeFormInjectiveObjective",
    "History",
    "ImportanceForwardKL",
    "MaximumLikelihood",
    "MetricsLogger",
    "NonFiniteGuard",
    "Objective",
    "PairRegression",
    "PrintMetrics",
    "RecordNFE",
    "RepresentationAlignment",
    "ReverseKL",
    "RunLockedError",
    "Trainer",
    "TrainingDiverged",
    "TrainingWarning",
    "WeightedSum",
    "annealed_temperature",
    "default_optimizer",
    "forward_kl_loss",
    "load_checkpoint",
    "pair_regression_loss",
    "read_checkpoint_header",
    "reverse_kl_loss",
    "save_checkpoint",
]
