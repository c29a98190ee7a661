"""Bijections: the transform contract and every invertible layer of the library."""

from flows.bijections.autoregressive import MaskedAutoregressive
from flows.bijections.base import Bijection, Chain, Inverse, InverseNotAvailable
from flows.bijections.block_autoregressive import BlockAutoregressive
from flows.bijections.blockwise import SharedBlocks
from flows.bijections.circulant import CirculantDiagonal, CirculantDiagonal2d
from flows.bijections.circular import (
    CircularRationalQuadraticSpline,
    CircularReflection,
    CircularShift,
    IntervalToLine,
    MixedSpline,
)
from flows.bijections.continuous import CNF, total_nfe
from flows.bijections.conv import Invertible1x1Conv
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling, Coupling, alternating_mask, half_mask
from flows.bijections.eiw import EIWShuffle, EntropyPermutation
from flows.bijections.elementwise import Affine, Elementwise, Logit, Sigmoid, SoftClip
from flows.bijections.injective import FreeFormInjective, InjectiveLinear, half_log_det_gram, orthogonal_probes
from flows.bijections.internal_coordinates import InternalCoordinates
from flows.bijections.linear import LULinear
from flows.bijections.monotone import (
    BernsteinTransformer,
    DeepSigmoidTransformer,
    MonotoneTransformer,
    SOSPolynomialTransformer,
    UMNNTransformer,
    clenshaw_curtis,
)
from flows.bijections.multiscale import Flatten, Split, Squeeze
from flows.bijections.normalization import ActNorm, ActNorm2d, BatchNorm
from flows.bijections.numerical_inverse import NumericalInverseError, fixed_point_inverse, monotone_inverse
from flows.bijections.orthogonal import Householder, QRLinear, SVDLinear, householder_matrix
from flows.bijections.patchify import Patchify
from flows.bijections.permutation import Permutation, Reverse
from flows.bijections.planar import Planar, Radial, Sylvester
from flows.bijections.residual import LipSwish, ResidualBlock, SpectralLinear, roulette_log_det
from flows.bijections.residual_conv import ConvResidualBlock, SpectralConv2d
from flows.bijections.splines import RationalQuadraticSpline
from flows.bijections.standardize import Standardize
from flows.bijections.stochastic import HMCBlock, LangevinBlock, MetropolisBlock, StochasticBlock
from flows.bijections.torch_transform import TorchTransform
from flows.bijections.transformer_autoregressive import TransformerAutoregressive
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
    "BernsteinTransformer",
    "Bijection",
    "BlockAutoregressive",
    "Chain",
    "CirculantDiagonal",
    "CirculantDiagonal2d",
    "CircularRationalQuadraticSpline",
    "CircularReflection",
    "CircularShift",
    "ConvResidualBlock",
    "Coupling",
    "DeepSigmoidTransformer",
    "EIWShuffle",
    "Elementwise",
    "EntropyPermutation",
    "Flatten",
    "FreeFormInjective",
    "HMCBlock",
    "Householder",
    "InjectiveLinear",
    "InternalCoordinates",
    "IntervalToLine",
    "Inverse",
    "InverseNotAvailable",
    "Invertible1x1Conv",
    "LULinear",
    "LangevinBlock",
    "LipSwish",
    "Logit",
    "MaskedAutoregressive",
    "MetropolisBlock",
    "MixedSpline",
    "MonotoneTransformer",
    "NumericalInverseError",
    "Patchify",
    "Permutation",
    "Planar",
    "QRLinear",
    "Radial",
    "RationalQuadraticSpline",
    "ResidualBlock",
    "Reverse",
    "SOSPolynomialTransformer",
    "SVDLinear",
    "SharedBlocks",
    "Sigmoid",
    "SoftClip",
    "SpectralConv2d",
    "SpectralLinear",
    "Split",
    "Squeeze",
    "Standardize",
    "StochasticBlock",
    "Sylvester",
    "TorchTransform",
    "Transformer",
    "TransformerAutoregressive",
    "UMNNTransformer",
    "alternating_mask",
    "clenshaw_curtis",
    "fixed_point_inverse",
    "half_log_det_gram",
    "half_mask",
    "householder_matrix",
    "monotone_inverse",
    "orthogonal_probes",
    "roulette_log_det",
    "total_nfe",
]
