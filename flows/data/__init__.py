"""Datasets and preprocessing: embedded defaults (scikit-learn's digits) and dequantization."""

from flows.data.dequantization import uniform_dequantize
from flows.data.digits import DIGITS_LEVELS, load_digits

__all__ = ["DIGITS_LEVELS", "load_digits", "uniform_dequantize"]
