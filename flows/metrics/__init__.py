"""Evaluation metrics: density (bits/dim), and (in their own modules) importance sampling and MCMC diagnostics."""

from flows.metrics.density import bits_per_dim

__all__ = ["bits_per_dim"]
