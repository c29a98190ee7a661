"""Bijections: the transform contract and every invertible layer of the library."""

from flows.bijections.autoregressive import MaskedAutoregressive
from flows.bijections.base import Bijection, Chain, Inverse, InverseNotAvailable
from flows.bijections.blockwise import SharedBlocks
from flows.bijections.circulant import CirculantDiagonal, CirculantDiagonal2d
from flows.bijections.circular import CircularRationalQuadraticSpline, CircularShift, IntervalToLine, MixedSpline
from flows.bijections.continuous import CNF, total_nfe
from flows.bijections.conv import Invertible1x1Conv
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling, Coupling, alternating_mask, half_mask
from flows.bijections.eiw import EIWShuffle, EntropyPermutation
from flows.bijections.elementwise import Affine, Elementwise, Logit, Sigmoid
from flows.bijections.injective import FreeFormInjective, InjectiveLinear, half_log_det_gram, orthogonal_probes
from flows.bijections.internal_coordinates import InternalCoordinates
from flows.bijections.linear import LULinear
from flows.bijections.multiscale import Flatten, Split, Squeeze
from flows.bijections.normalization import ActNorm, ActNorm2d, BatchNorm
from flows.bijections.permutation import Permutation, Reverse
from flows.bijections.splines import RationalQuadraticSpline
from flows.bijections.standardize import Standardize
from flows.bijections.stochastic import HMCBlock, LangevinBlock, MetropolisBlock, StochasticBlock
from flows.bijections.torch_transform import TorchTransform
from flows.bijections.transformers import AdditiveTransformer, AffineTransformer, Transformer

__all__ = [
    "CNF",
    "ActNorm",
    "ActNorm2d",
    "AdditiveCoupling",
    "AdditiveTransformer",
    "Affine",
    "AffineCoupling",
    "AffineTransformer",
    "BatchNorm",
    "Bijection",
    "Chain",
    "CirculantDiagonal",
    "CirculantDiagonal2d",
    "CircularRationalQuadraticSpline",
    "CircularShift",
    "Coupling",
    "EIWShuffle",
    "Elementwise",
    "EntropyPermutation",
    "Flatten",
    "FreeFormInjective",
    "HMCBlock",
    "InjectiveLinear",
    "InternalCoordinates",
    "IntervalToLine",
    "Inverse",
    "InverseNotAvailable",
    "Invertible1x1Conv",
    "LULinear",
    "LangevinBlock",
    "Logit",
    "MaskedAutoregressive",
    "MetropolisBlock",
    "MixedSpline",
    "Permutation",
    "RationalQuadraticSpline",
    "Reverse",
    "SharedBlocks",
    "Sigmoid",
    "Split",
    "Squeeze",
    "Standardize",
    "StochasticBlock",
    "TorchTransform",
    "Transformer",
    "alternating_mask",
    "half_log_det_gram",
    "half_mask",
    "orthogonal_probes",
    "total_nfe",
]
