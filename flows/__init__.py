"""flows: normalizing flows for PyTorch with exact log-determinant bookkeeping.

Direction convention: a transform's forward direction maps data ``x`` to latent ``z``, and
``log p(x) = log p_Z(f(x)) + log|det J_f(x)|``. Sampling runs the inverse.

Importing is cheap: ``torch._dynamo``, ``scipy``, ``torchdiffeq``, ``matplotlib`` and ``tqdm`` are
imported where first used. The library logs through :mod:`logging` under the ``flows`` logger
(silent until an application configures logging) and prints nothing itself; the ``flows`` command
prints its own results.
"""

import logging as _logging

from flows.architectures import FFJORD, IAF, MAF, NICE, NSF, FreeFormInjectiveFlow, Glow, RealNVP
from flows.auxiliary import AuxiliaryLosses, add_auxiliary_loss
from flows.bijections import (
    CNF,
    ActNorm,
    ActNorm2d,
    AdditiveCoupling,
    AdditiveTransformer,
    Affine,
    AffineCoupling,
    AffineTransformer,
    BatchNorm,
    Bijection,
    Chain,
    CirculantDiagonal,
    CirculantDiagonal2d,
    Coupling,
    EIWShuffle,
    Elementwise,
    EntropyPermutation,
    Flatten,
    FreeFormInjective,
    HMCBlock,
    InjectiveLinear,
    Inverse,
    InverseNotAvailable,
    Invertible1x1Conv,
    LangevinBlock,
    Logit,
    LULinear,
    MaskedAutoregressive,
    MetropolisBlock,
    Permutation,
    RationalQuadraticSpline,
    Reverse,
    SharedBlocks,
    Sigmoid,
    Split,
    Squeeze,
    Standardize,
    TorchTransform,
    Transformer,
)
from flows.dependent import DependentFlow, MatrixNormal
from flows.distributions import DiagNormal, Distribution, StandardNormal, TorchDistribution
from flows.flow import Flow, FlowDistribution, evaluating, monte_carlo_kl
from flows.model_file import load_model, save_model
from flows.nn import MADE, MLP, ConvNet, PooledMLP, TimeMLP
from flows.testing import BijectionCheckError, check_bijection

__version__ = "0.1.0"

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "CNF",
    "FFJORD",
    "IAF",
    "MADE",
    "MAF",
    "MLP",
    "NICE",
    "NSF",
    "ActNorm",
    "ActNorm2d",
    "AdditiveCoupling",
    "AdditiveTransformer",
    "Affine",
    "AffineCoupling",
    "AffineTransformer",
    "AuxiliaryLosses",
    "BatchNorm",
    "Bijection",
    "BijectionCheckError",
    "Chain",
    "CirculantDiagonal",
    "CirculantDiagonal2d",
    "ConvNet",
    "Coupling",
    "DependentFlow",
    "DiagNormal",
    "Distribution",
    "EIWShuffle",
    "Elementwise",
    "EntropyPermutation",
    "Flatten",
    "Flow",
    "FlowDistribution",
    "FreeFormInjective",
    "FreeFormInjectiveFlow",
    "Glow",
    "HMCBlock",
    "InjectiveLinear",
    "Inverse",
    "InverseNotAvailable",
    "Invertible1x1Conv",
    "LULinear",
    "LangevinBlock",
    "Logit",
    "MaskedAutoregressive",
    "MatrixNormal",
    "MetropolisBlock",
    "Permutation",
    "PooledMLP",
    "RationalQuadraticSpline",
    "RealNVP",
    "Reverse",
    "SharedBlocks",
    "Sigmoid",
    "Split",
    "Squeeze",
    "StandardNormal",
    "Standardize",
    "TimeMLP",
    "TorchDistribution",
    "TorchTransform",
    "Transformer",
    "__version__",
    "add_auxiliary_loss",
    "check_bijection",
    "evaluating",
    "load_model",
    "monte_carlo_kl",
    "save_model",
]
