"""Bijections: the transform contract and every invertible layer of the library."""

from flows.bijections.base import Bijection, Chain, Inverse, InverseNotAvailable
from flows.bijections.conv import Invertible1x1Conv
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling, Coupling, alternating_mask, half_mask
from flows.bijections.eiw import EIWShuffle, EntropyPermutation
from flows.bijections.elementwise import Affine, Elementwise, Logit, Sigmoid
from flows.bijections.linear import LULinear
from flows.bijections.multiscale import Flatten, Split, Squeeze
from flows.bijections.normalization import ActNorm, ActNorm2d
from flows.bijections.permutation import Permutation, Reverse
from flows.bijections.standardize import Standardize
from flows.bijections.transformers import AdditiveTransformer, AffineTransformer, Transformer

__all__ = [
    "ActNorm",
    "ActNorm2d",
    "AdditiveCoupling",
    "AdditiveTransformer",
    "Affine",
    "AffineCoupling",
    "AffineTransformer",
    "Bijection",
    "Chain",
    "Coupling",
    "EIWShuffle",
    "Elementwise",
    "EntropyPermutation",
    "Flatten",
    "Inverse",
    "InverseNotAvailable",
    "Invertible1x1Conv",
    "LULinear",
    "Logit",
    "Permutation",
    "Reverse",
    "Sigmoid",
    "Split",
    "Squeeze",
    "Standardize",
    "Transformer",
    "alternating_mask",
    "half_mask",
]
