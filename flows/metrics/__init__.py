"""Evaluation metrics: density (bits/dim), and (in their own modules) importance sampling and MCMC diagnostics."""

from flows.metrics.density import bits_per_dim
from flows.metrics.importance import (
    FreeEnergyProfile,
    free_energy_profile,
    kish_ess,
    log_importance_weights,
    log_z_estimate,
    reweighted_mean,
    sample_log_weights,
)

__all__ = [
    "FreeEnergyProfile",
    "bits_per_dim",
    "free_energy_profile",
    "kish_ess",
    "log_importance_weights",
    "log_z_estimate",
    "reweighted_mean",
    "sample_log_weights",
]
