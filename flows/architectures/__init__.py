"""Paper-named flow builders, all with the signature shape ``Name(features, context=0, *, ...)``.

One module per family; every builder is a :class:`~flows.flow.Flow` subclass.
"""

from flows.architectures.coupling import NICE, RealNVP
from flows.architectures.glow import Glow

__all__ = ["NICE", "Glow", "RealNVP"]
