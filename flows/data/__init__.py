"""Datasets and preprocessing: embedded defaults, files from a data directory, dequantization."""

from flows.data.dequantization import VariationalDequantizer, uniform_dequantize
from flows.data.digits import DIGITS_LEVELS, load_digits
from flows.data.files import KNOWN_FILES, data_dir, data_file, download
from flows.data.mnist import MNIST_LEVELS, load_mnist

__all__ = [
    "DIGITS_LEVELS",
    "KNOWN_FILES",
    "MNIST_LEVELS",
    "VariationalDequantizer",
    "data_dir",
    "data_file",
    "download",
    "load_digits",
    "load_mnist",
    "uniform_dequantize",
]
