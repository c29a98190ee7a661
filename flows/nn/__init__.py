"""Neural networks: the conditioners that output a transform's raw parameters, and vector fields.

One concept a file: :class:`MLP` (``mlp.py``), :class:`MADE` and its degree masks (``made.py``),
the time-conditioned :class:`TimeMLP` with hand-written JVPs (``time.py``), the image conditioners
:class:`ConvNet` (``conv.py``) and :class:`PooledMLP` (``pooled.py``), NanoFlow's shared-parameter
:class:`StepConditioner` (``sharing.py``) and the E(n)-equivariant graph network :class:`EGNN`
(``egnn.py``), and the causal transformer :class:`CausalTransformer` with its :class:`KVCache`
(``transformer.py``).
"""

from flows.nn.conv import ConvNet
from flows.nn.egnn import EGNN
from flows.nn.made import MADE
from flows.nn.mlp import MLP
from flows.nn.pooled import PooledMLP
from flows.nn.sharing import StepConditioner
from flows.nn.time import TIME_MLP_ACTIVATIONS, TimeMLP
from flows.nn.transformer import CausalTransformer, KVCache

__all__ = [
    "EGNN",
    "MADE",
    "MLP",
    "TIME_MLP_ACTIVATIONS",
    "CausalTransformer",
    "ConvNet",
    "KVCache",
    "PooledMLP",
    "StepConditioner",
    "TimeMLP",
]
