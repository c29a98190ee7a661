"""Paper-named flow builders, all with the signature shape ``Name(features, context=0, *, ...)``.

One module per family; every builder is a :class:`~flows.flow.Flow` subclass, registered where it
is defined in the public registry :mod:`flows.architectures.registry` (``builders()``, ``get``,
``register``), which :func:`flows.save_model` and ``flows models`` read.
"""

from flows.architectures.autoregressive import IAF, MAF, NSF
from flows.architectures.circular import NCSF
from flows.architectures.continuous import FFJORD
from flows.architectures.coupling import NICE, RealNVP
from flows.architectures.glow import Glow
from flows.architectures.injective import FreeFormInjectiveFlow
from flows.architectures.monotone import BNAF, BPF, NAF, SOSPF, UNAF
from flows.architectures.residual import ResidualFlow
from flows.architectures.transformer import TarFlow

__all__ = [
    "BNAF",
    "BPF",
    "FFJORD",
    "IAF",
    "MAF",
    "NAF",
    "NCSF",
    "NICE",
    "NSF",
    "SOSPF",
    "UNAF",
    "FreeFormInjectiveFlow",
    "Glow",
    "RealNVP",
    "ResidualFlow",
    "TarFlow",
]
