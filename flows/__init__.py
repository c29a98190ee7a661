"""flows: normalizing flows for PyTorch with exact log-determinant bookkeeping.

Direction convention: a transform's forward direction maps data ``x`` to latent ``z``, and
``log p(x) = log p_Z(f(x)) + log|det J_f(x)|``. Sampling runs the inverse.
"""

from flows.architectures import NICE, Glow, RealNVP
from flows.auxiliary import AuxiliaryLosses, add_auxiliary_loss
from flows.bijections import (
    ActNorm,
    ActNorm2d,
    AdditiveCoupling,
    AdditiveTransformer,
    Affine,
    AffineCoupling,
    AffineTransformer,
    Bijection,
    Chain,
    Coupling,
    EIWShuffle,
    Elementwise,
    EntropyPermutation,
    Flatten,
    Inverse,
    InverseNotAvailable,
    Invertible1x1Conv,
    Logit,
    LULinear,
    Permutation,
    Reverse,
    Sigmoid,
    Split,
    Squeeze,
    Standardize,
    Transformer,
)
from flows.dependent import DependentFlow, MatrixNormal
from flows.distributions import DiagNormal, Distribution, StandardNormal
from flows.flow import Flow, evaluating
from flows.nn import MLP, ConvNet, PooledMLP
from flows.testing import BijectionCheckError, check_bijection

__version__ = "0.1.0"

__all__ = [
    "MLP",
    "NICE",
    "ActNorm",
    "ActNorm2d",
    "AdditiveCoupling",
    "AdditiveTransformer",
    "Affine",
    "AffineCoupling",
    "AffineTransformer",
    "AuxiliaryLosses",
    "Bijection",
    "BijectionCheckError",
    "Chain",
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
    "Glow",
    "Inverse",
    "InverseNotAvailable",
    "Invertible1x1Conv",
    "LULinear",
    "Logit",
    "MatrixNormal",
    "Permutation",
    "PooledMLP",
    "RealNVP",
    "Reverse",
    "Sigmoid",
    "Split",
    "Squeeze",
    "StandardNormal",
    "Standardize",
    "Transformer",
    "__version__",
    "add_auxiliary_loss",
    "check_bijection",
    "evaluating",
]
