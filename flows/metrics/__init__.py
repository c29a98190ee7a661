"""Evaluation metrics: density (bits/dim), and (in their own modules) importance sampling and MCMC diagnostics."""

from flows.metrics.denoising import tweedie_denoise
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
from flows.metrics.mcmc import (
    acceptance_rate,
    effective_sample_size,
    integrated_autocorr_time,
    mode_weight_error,
    mode_weights,
    sliced_wasserstein,
    split_rhat,
)
from flows.metrics.molecules import StateFreeEnergy, histogram_kl, state_free_energy, torsion_periodic_distance

__all__ = [
    "FreeEnergyProfile",
    "StateFreeEnergy",
    "acceptance_rate",
    "bits_per_dim",
    "effective_sample_size",
    "free_energy_profile",
    "histogram_kl",
    "integrated_autocorr_time",
    "kish_ess",
    "log_importance_weights",
    "log_z_estimate",
    "mode_weight_error",
    "mode_weights",
    "reweighted_mean",
    "sample_log_weights",
    "sliced_wasserstein",
    "split_rhat",
    "state_free_energy",
    "torsion_periodic_distance",
    "tweedie_denoise",
]
