"""Evaluation metrics: density (bits/dim), and (in their own modules) importance sampling and MCMC diagnostics."""

from flows.metrics.density import bits_per_dim
from flows.metrics.mcmc import (
    acceptance_rate,
    effective_sample_size,
    integrated_autocorr_time,
    mode_weight_error,
    mode_weights,
    sliced_wasserstein,
    split_rhat,
)

__all__ = [
    "acceptance_rate",
    "bits_per_dim",
    "effective_sample_size",
    "integrated_autocorr_time",
    "mode_weight_error",
    "mode_weights",
    "sliced_wasserstein",
    "split_rhat",
]
