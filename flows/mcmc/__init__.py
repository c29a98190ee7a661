"""Flow-enhanced MCMC: batched-chain kernels (local, flow-proposal, NeuTra, global-local) and a driver.

Every kernel maps a :class:`State` of ``chains`` positions to a new one that leaves the target
invariant and reports its acceptance in a :class:`StepInfo`; :func:`sample` runs the warm-up
(adaptation) and the recorded steps and returns a :class:`Trace`. Diagnostics are in
:mod:`flows.metrics.mcmc`, plots in :mod:`flows.plot.mcmc`.
"""

from flows._kernels import metropolis_accept
from flows.mcmc.adaptation import DualAveraging
from flows.mcmc.base import Kernel, State, StepInfo
from flows.mcmc.counting import CountingTarget
from flows.mcmc.global_local import GlobalLocal
from flows.mcmc.independent import IMH, ISIR, imh_log_ratio
from flows.mcmc.local import HMC, MALA, RandomWalk
from flows.mcmc.neutra import NeuTra, PullbackTarget
from flows.mcmc.sampler import Trace, sample

__all__ = [
    "HMC",
    "IMH",
    "ISIR",
    "MALA",
    "CountingTarget",
    "DualAveraging",
    "GlobalLocal",
    "Kernel",
    "NeuTra",
    "PullbackTarget",
    "RandomWalk",
    "State",
    "StepInfo",
    "Trace",
    "imh_log_ratio",
    "metropolis_accept",
    "sample",
]
