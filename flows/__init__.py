"""flows: normalizing flows for PyTorch with exact log-determinant bookkeeping.

Direction convention: a transform's forward direction maps data ``x`` to latent ``z``, and
``log p(x) = log p_Z(f(x)) + log|det J_f(x)|``. Sampling runs the inverse.
"""

from flows.architectures import IAF, MAF, NICE, NSF, FreeFormInjectiveFlow, RealNVP
from flows.auxiliary import AuxiliaryLosses, add_auxiliary_loss
from flows.bijections import (
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
    Elementwise,
    FreeFormInjective,
    InjectiveLinear,
    Inverse,
    InverseNotAvailable,
    Logit,
    LULinear,
    MaskedAutoregressive,
    Permutation,
    RationalQuadraticSpline,
    Reverse,
    Sigmoid,
    Standardize,
    Transformer,
)
from flows.dependent import DependentFlow, MatrixNormal
from flows.distributions import DiagNormal, Distribution, StandardNormal
from flows.flow import Flow, evaluating
from flows.nn import MADE, MLP
from flows.testing import BijectionCheckError, check_bijection

__version__ = "0.1.0"

__all__ = [
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
    "Coupling",
    "DependentFlow",
    "DiagNormal",
    "Distribution",
    "Elementwise",
    "Flow",
    "FreeFormInjective",
    "FreeFormInjectiveFlow",
    "InjectiveLinear",
    "Inverse",
    "InverseNotAvailable",
    "LULinear",
    "Logit",
    "MaskedAutoregressive",
    "MatrixNormal",
    "Permutation",
    "RationalQuadraticSpline",
    "RealNVP",
    "Reverse",
    "Sigmoid",
    "StandardNormal",
    "Standardize",
    "Transformer",
    "__version__",
    "add_auxiliary_loss",
    "check_bijection",
    "evaluating",
]
