"""Datasets and preprocessing: embedded defaults, files from a data directory, dequantization."""

from flows.data.dequantization import uniform_dequantize
from flows.data.digits import DIGITS_LEVELS, load_digits
from flows.data.files import KNOWN_FILES, data_dir, data_file, download
from flows.data.loader import TensorLoader

__all__ = [
    "DIGITS_LEVELS",
    "KNOWN_FILES",
    "TensorLoader",
    "data_dir",
    "data_file",
    "download",
    "load_digits",
    "uniform_dequantize",
]
