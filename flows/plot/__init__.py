"""Pictures of training runs, densities, samples and samplers (matplotlib, imported only when a function is called).

Every function returns a :class:`matplotlib.figure.Figure` built without ``pyplot`` (no global
state, no display needed) and, given ``path``, also saves it.
"""

from flows.plot.density import plot_corner, plot_density_2d
from flows.plot.images import plot_image_grid
from flows.plot.mcmc import plot_chain_pairs, plot_trace
from flows.plot.molecules import plot_ramachandran
from flows.plot.particles import plot_particle_histograms
from flows.plot.training import plot_history

__all__ = [
    "plot_chain_pairs",
    "plot_corner",
    "plot_density_2d",
    "plot_history",
    "plot_image_grid",
    "plot_particle_histograms",
    "plot_ramachandran",
    "plot_trace",
]
