"""flows: normalizing flows for PyTorch with exact log-determinant bookkeeping.

Direction convention: a transform's forward direction maps data ``x`` to latent ``z``, and
``log p(x) = log p_Z(f(x)) + log|det J_f(x)|``. Sampling runs the inverse.

Importing is cheap: ``torch._dynamo``, ``scipy``, ``torchdiffeq``, ``matplotlib`` and ``tqdm`` are
imported where first used. The library logs through :mod:`logging` under the ``flows`` logger
(silent until an application configures logging) and prints nothing itself; the ``flows`` command
prints its own results.
"""

import logging as _logging

# first: in the `flows` command, Ctrl-C while the rest imports gives one line and exit 130 (see the module)
from flows.cli import _interrupt as _cli_interrupt  # noqa: F401

# isort: split

from flows import classify
from flows.architectures import (
    BNAF,
    BPF,
    FFJORD,
    IAF,
    MAF,
    NAF,
    NICE,
    NSF,
    SOSPF,
    UNAF,
    FreeFormInjectiveFlow,
    Glow,
    RealNVP,
    TarFlow,
)
from flows.architectures.circular import NCSF
from flows.architectures.dependent import DependentFlow, MatrixNormal
from flows.architectures.residual import ResidualFlow
from flows.bijections import *  # noqa: F403  (every layer: the one list is flows.bijections.__all__)
from flows.bijections import __all__ as _bijections_all
from flows.bijections.auxiliary import AuxiliaryLosses, add_auxiliary_loss
from flows.distributions import DiagNormal, Distribution, Mixture, StandardNormal, TorchDistribution
from flows.flow import Flow, FlowDistribution, evaluating, monte_carlo_kl
from flows.metrics.denoising import tweedie_denoise
from flows.model_file import load_model, save_model
from flows.nn import MADE, MLP, ConvNet, PooledMLP, TimeMLP
from flows.testing import BijectionCheckError, check_bijection

__version__ = "0.1.0"

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    *_bijections_all,
    "BNAF",
    "BPF",
    "FFJORD",
    "IAF",
    "MADE",
    "MAF",
    "MLP",
    "NCSF",
    "NICE",
    "NSF",
    "NAF",
    "SOSPF",
    "UNAF",
    "AuxiliaryLosses",
    "BijectionCheckError",
    "ConvNet",
    "DependentFlow",
    "DiagNormal",
    "Mixture",
    "Distribution",
    "Flow",
    "FlowDistribution",
    "FreeFormInjectiveFlow",
    "Glow",
    "MatrixNormal",
    "PooledMLP",
    "RealNVP",
    "ResidualFlow",
    "StandardNormal",
    "TarFlow",
    "TimeMLP",
    "TorchDistribution",
    "__version__",
    "add_auxiliary_loss",
    "check_bijection",
    "classify",
    "evaluating",
    "load_model",
    "monte_carlo_kl",
    "save_model",
    "tweedie_denoise",
]
