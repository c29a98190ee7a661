"""Datasets and preprocessing: embedded defaults, files from a data directory, dequantization."""

from flows.data.dataset import DATASETS, Dataset, data_fingerprint, load_dataset, split_data
from flows.data.dequantization import VariationalDequantizer, uniform_dequantize
from flows.data.digits import DIGITS_LEVELS, load_digits
from flows.data.files import KNOWN_FILES, data_dir, data_file, download
from flows.data.loader import TensorLoader
from flows.data.manifolds import SineManifold
from flows.data.mnist import MNIST_LEVELS, load_mnist
from flows.data.tabular import SKLEARN_TABLES, load_array, load_csv, load_miniboone, load_sklearn_table

__all__ = [
    "DATASETS",
    "DIGITS_LEVELS",
    "KNOWN_FILES",
    "MNIST_LEVELS",
    "SKLEARN_TABLES",
    "Dataset",
    "SineManifold",
    "TensorLoader",
    "VariationalDequantizer",
    "data_dir",
    "data_file",
    "data_fingerprint",
    "download",
    "load_array",
    "load_csv",
    "load_dataset",
    "load_digits",
    "load_miniboone",
    "load_mnist",
    "load_sklearn_table",
    "split_data",
    "uniform_dequantize",
]
