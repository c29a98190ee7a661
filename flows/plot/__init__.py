"""Pictures of samplers and samples (matplotlib, imported only when a function is called).

Every function returns a :class:`matplotlib.figure.Figure` built without ``pyplot`` (no global
state, no display needed) and, given ``path``, also saves it.
"""

from flows.plot.mcmc import plot_chain_pairs, plot_trace

__all__ = ["plot_chain_pairs", "plot_trace"]
