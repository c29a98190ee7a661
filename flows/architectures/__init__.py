"""Paper-named flow builders, all with the signature shape ``Name(features, context=0, *, ...)``.

One module per family; every builder is a :class:`~flows.flow.Flow` subclass.
"""

from flows.architectures.autoregressive import IAF, MAF, NSF
from flows.architectures.circular import NCSF
from flows.architectures.continuous import FFJORD
from flows.architectures.coupling import NICE, RealNVP
from flows.architectures.glow import Glow
from flows.architectures.injective import FreeFormInjectiveFlow

__all__ = ["FFJORD", "IAF", "MAF", "NCSF", "NICE", "NSF", "FreeFormInjectiveFlow", "Glow", "RealNVP"]
