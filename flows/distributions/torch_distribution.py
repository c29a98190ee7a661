"""Any :class:`torch.distributions.Distribution` as a base: :class:`TorchDistribution`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributions as td
import torch.distributions.transforms as tdt
from torch import Tensor, nn
from torch.distributions import constraints

from flows._adoption import Adopting, adopt, copyable
from flows._validation import check_event
from flows.distributions.base import Distribution

__all__ = ["TorchDistribution"]


def _tensor_arguments(d: td.Distribution) -> dict[str, Tensor]:
    """The constructor arguments of ``d`` that were given (``arg_constraints`` names set on the instance)."""
    found = {k: v for k, v in vars(d).items() if k in d.arg_constraints and isinstance(v, Tensor)}
    if isinstance(d, td.MultivariateNormal):  # exactly one matrix parameterisation may be given
        found = {"loc": d.loc, "scale_tril": d.scale_tril}
    return found


def _trainable(name: str, value: Tensor, family: str) -> nn.Parameter:
    """The ``nn.Parameter`` behind a trainable argument (itself, or the one a broadcast view expands), else raise."""
    if isinstance(value, nn.Parameter):
        return value
    base = value._base
    if isinstance(base, nn.Parameter):
        try:
            if torch.equal(base.detach().expand(value.shape), value.detach()):
                return base
        except RuntimeError:  # a slice of a larger parameter: it does not expand to the argument
            pass
    raise TypeError(
        f"TorchDistribution: expected the arguments of {family} to be constants or nn.Parameters, got {name} "
        f"computed from trainable tensors ({type(value.grad_fn).__name__}), which the base cannot own: it would be "
        "frozen at its current value; pass the nn.Parameter itself, or put a learnable layer (flows.Affine) in front"
    )


def _composite(d: td.Distribution) -> bool:
    """Whether ``d`` is built from other objects (a mixture, a transformed or a flow's distribution)."""
    return any(
        isinstance(v, (td.Distribution, tdt.Transform, nn.Module))
        or (isinstance(v, (list, tuple)) and any(isinstance(u, (td.Distribution, tdt.Transform)) for u in v))
        for v in vars(d).values()
    )


def _no_validation(d: object) -> None:
    """Switch argument validation off in ``d`` and the distributions inside it (the base checks its support)."""
    if isinstance(d, td.Distribution):
        d._validate_args = False
        for value in vars(d).values():
            _no_validation(value)
    elif isinstance(d, (list, tuple)):
        for value in d:
            _no_validation(value)


def _real_support(support: constraints.Constraint) -> bool:
    """Whether ``support`` is the whole real space: ``real``, ``real_vector`` or ``independent(real, k)``."""
    while isinstance(support, (constraints.independent, constraints.MixtureSameFamilyConstraint)):
        support = support.base_constraint
    return support is constraints.real


def check_support(distribution: td.Distribution, who: str = "TorchDistribution") -> constraints.Constraint:
    r"""Return the support of ``distribution`` if a flow on :math:`\mathbb R^d` can use it as its base, else raise.

    A flow's transform is a bijection of the real space: a base must be a density on all of it.
    A discrete base (``Bernoulli``, ``Poisson``, ``Categorical``) has no density there, and a
    simplex or interval one (``Dirichlet``, ``Beta``) gives ``-inf`` or, rebuilt without argument
    validation, finite nonsense for latents outside its support. (Bounded data belongs in the
    transform, e.g. a sigmoid layer, with a real base.)

    Raises:
        TypeError: for a support other than ``real``, ``real_vector`` or ``independent(real, k)``,
            naming the support that came.
    """
    try:
        support = distribution.support
    except NotImplementedError:
        support = None
    inner = distribution
    while isinstance(inner, td.Independent):
        inner = inner.base_dist
    if isinstance(inner, td.VonMises):  # declares `real` but is a density on a circle (periodic on R)
        raise TypeError(
            f"{who}: expected a base distribution with a density on the real space, got VonMises, a circular "
            "distribution whose declared support `real` repeats every 2 pi"
        )
    if support is None or not _real_support(support):
        raise TypeError(
            f"{who}: expected a base distribution with real support (real, real_vector or independent(real)), "
            f"got {type(distribution).__name__} with support {support}"
            + ("" if support is None or support.is_discrete is False else " (a discrete distribution has no density)")
        )
    return support


class TorchDistribution(Adopting, Distribution):
    r"""A :class:`torch.distributions.Distribution` as a base-distribution module.

    The distribution's tensor arguments (``loc``, ``scale``, ``df``, ...) become buffers, so they
    move with ``.to()``/``.double()`` and are saved in ``state_dict()``; the distribution object is
    rebuilt from the buffers on each call (cheap: no computation happens at construction). All of
    the distribution's batch dimensions are taken as event dimensions (a base has no batch), as
    ``Independent(d, len(d.batch_shape))`` would. ``context`` is accepted and only sets the batch
    shape of samples. An argument that is an ``nn.Parameter`` (or a broadcast of one, as
    ``Normal(loc, scale)`` stores it) stays that parameter, trainable and saved; one computed from
    trainable tensors (``Categorical(logits=p)`` normalises ``p``) is refused, since it would be
    frozen. Other arguments are fixed; a learnable :class:`~flows.bijections.Affine` layer in front
    learns a location and a scale.

    A distribution built from other objects (``MixtureSameFamily``, ``TransformedDistribution``,
    a flow's own ``flow()``) is held as it is rather than rebuilt: its tensors become buffers (the
    object is pointed at them), the modules it computes with (a flow, a zuko or Pyro transform)
    become submodules, so their parameters train with the flow and are saved with it.

    Args:
        distribution: e.g. ``StudentT(df, loc, scale)`` or ``Independent(Laplace(loc, scale), 1)``,
            whose arguments are tensors of the event shape.

    Only bases on the whole real space are accepted (:func:`check_support`): ``log_prob`` is
    ``-inf`` for a latent the support does not hold, whatever the rebuilt distribution (which
    skips argument validation) would compute there, and NaN stays NaN.

    Raises:
        TypeError: for something that is not a ``torch.distributions.Distribution``, one whose
            support is not the real space (a discrete or simplex distribution), or an argument
            computed from trainable tensors.
        ValueError: for a distribution that cannot be rebuilt from its tensor arguments.

    Example:
        >>> import torch
        >>> from torch.distributions import StudentT
        >>> d = TorchDistribution(StudentT(torch.full((3,), 4.0), torch.zeros(3), torch.ones(3)))
        >>> d.event_shape, d.sample((5,)).shape, d.log_prob(torch.zeros(2, 3)).shape
        (torch.Size([3]), torch.Size([5, 3]), torch.Size([2]))
    """

    def __init__(self, distribution: td.Distribution) -> None:
        if not isinstance(distribution, td.Distribution):
            raise TypeError(
                f"TorchDistribution: expected a torch.distributions.Distribution, got {type(distribution).__name__}"
            )
        support = check_support(distribution)
        inner = distribution
        while isinstance(inner, td.Independent):
            inner = inner.base_dist
        super().__init__(tuple(inner.batch_shape) + tuple(inner.event_shape))
        self.support = support
        self.family = type(inner)
        self._held: td.Distribution | None = None
        self._slots: list = []
        arguments = _tensor_arguments(inner)
        if not arguments and _composite(inner):  # held as it is; its tensors become buffers, its modules submodules
            self._hold(inner)
            return
        self._names = sorted(arguments)
        for name in self._names:
            value = arguments[name]
            if value.requires_grad:  # a learnable argument stays a parameter (the same object)
                self.register_parameter(name, _trainable(name, value, type(inner).__name__))
            else:
                self.register_buffer(name, value.detach().clone())
        try:
            rebuilt = self.distribution()
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"TorchDistribution: expected a distribution that can be rebuilt from its tensor arguments "
                f"{self._names}, got {type(inner).__name__}: {error}"
            ) from error
        self._reinterpreted = len(rebuilt.batch_shape)

    def _hold(self, inner: td.Distribution) -> None:
        """Keep a composite distribution as it is (argument validation off, as for rebuilt ones)."""
        if isinstance(inner, td.TransformedDistribution):  # torch's inverse transforms break copy.deepcopy
            inner.transforms = [copyable(t) for t in inner.transforms]
        _no_validation(inner)
        self._slots = adopt(self, inner, "TorchDistribution", path="d")
        self._held, self._names = inner, []
        self._reinterpreted = len(inner.batch_shape)

    def distribution(self) -> td.Distribution:
        """The wrapped distribution, rebuilt from the current buffers (all dimensions as event dimensions)."""
        if self._held is not None:
            n = self._reinterpreted
            return td.Independent(self._held, n) if n else self._held
        d = self.family(**{k: getattr(self, k) for k in self._names}, validate_args=False)
        return td.Independent(d, len(d.batch_shape)) if len(d.batch_shape) else d

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        batch = x.shape[: x.dim() - len(self.event_shape)]
        if not batch.numel():  # torch's Independent cannot reshape an empty batch ([0, -1] is ambiguous)
            return x.sum(tuple(range(len(batch), x.dim()))) if self.event_shape else x.clone()
        d = self.distribution()
        log_p = d.log_prob(x)
        n = len(self.event_shape) - self.support.event_dim  # event dims the support's check leaves per entry
        inside = self.support.check(x)
        inside = inside.flatten(inside.dim() - n).all(-1) if n else inside
        nan = torch.isnan(x).flatten(x.dim() - len(self.event_shape)).any(-1) if self.event_shape else torch.isnan(x)
        return torch.where(inside | nan, log_p, -torch.inf)

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        shape = self._sample_shape(sample_shape, context)
        batch = shape[: len(shape) - len(self.event_shape)]
        d = self.distribution()
        return d.rsample(batch) if d.has_rsample else d.sample(batch)

    def extra_repr(self) -> str:
        return f"{self.family.__name__}, event_shape={tuple(self.event_shape)}"
