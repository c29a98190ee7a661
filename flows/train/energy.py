r"""Training on energy targets: reverse KL (energy), forward KL on samples, their mixtures, with temperature.

For a flow :math:`q_\theta` and a target :math:`\pi \propto e^{-u/T}` at temperature :math:`T`:

* **reverse KL** (energy training, needs no data):
  :math:`L_{\text{rev}} = \mathbb E_{x \sim q}[\log q(x) + u(x)/T] = \mathrm{KL}(q \,\|\, \pi) - \log Z_T`,
  estimated with reparameterised samples (``flow.sample_and_log_prob``). It is mode-seeking: a
  flow that drops a mode can reach a small loss and a high ESS while its :math:`\log Z` estimate
  is off by the log of the missing mass (see ``docs/boltzmann.md``);
* **forward KL** (maximum likelihood on samples of the target, e.g. MD data or exact samples):
  :math:`L_{\text{fwd}} = -\mathbb E_{x \sim \pi}[\log q(x)] = \mathrm{KL}(\pi \,\|\, q) + H(\pi)`,
  mass-covering;
* **mixtures** :math:`w_{\text{fwd}} L_{\text{fwd}} + w_{\text{rev}} L_{\text{rev}}` (SNF trains the
  double well with ML first, then 0.5/0.5);
* **importance-weighted forward KL** (:class:`ImportanceForwardKL`, needs no data): the forward KL
  estimated from the model's own samples, optionally mixed with *moved* copies of them (a torsion
  turned by a fixed angle, a reflection), so that a mode the model misses but a move reaches is
  learnt from the energy alone.

With stochastic blocks in the flow both losses are the SNF path-space versions (the path terms
enter through ``log q``), as in Wu, Köhler, Noé (2020).

The objectives plug into :class:`~flows.train.Trainer` (progress, checkpoints, NaN guard); mix them
with :class:`~flows.train.WeightedSum`. :class:`ReverseKL` needs no data: train with
``trainer.fit(None, val=[None], steps_per_epoch=..., max_steps=...)`` (``val=[None]`` asks for its
validation measures every epoch) and anneal its temperature with the :class:`AnnealTemperature`
callback::

    objective = ReverseKL(target, batch_size=512)
    trainer = Trainer(flow, objective, callbacks=[AnnealTemperature(objective, steps=3000)])
    trainer.fit(None, val=[None], steps_per_epoch=500, max_steps=3000)

References:
    Noé, Olsson, Köhler, Wu (2019), "Boltzmann generators: Sampling equilibrium states of
    many-body systems with deep learning", Science 365, arXiv:1812.01729.
    Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from flows._validation import SEED_MAX, check_count
from flows.flow import Flow
from flows.metrics.importance import kish_ess, log_z_estimate, sample_log_weights
from flows.targets.base import EnergyTarget, as_target
from flows.targets.interpolated import TemperedEnergy
from flows.train.callbacks import Callback
from flows.train.objectives import MaximumLikelihood, Objective, ObjectiveOutput

__all__ = [
    "AnnealTemperature",
    "ForwardKL",
    "ImportanceForwardKL",
    "ReverseKL",
    "annealed_temperature",
    "forward_kl_loss",
    "linlog_energy",
    "reverse_kl_loss",
]


def _check_temperature(temperature: float, who: str) -> float:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{who}: expected a positive finite temperature, got {temperature!r}")
    return float(temperature)


def annealed_temperature(progress: float, *, start: float = 4.0, end: float = 1.0, until: float = 0.6) -> float:
    r"""Geometric temperature schedule for reverse-KL training.

    :math:`T = T_0^{1-s}\, T_1^{s}` with :math:`s = \min(1, p/p_1)` at progress :math:`p`.

    Reverse KL at :math:`T = 1` from a flow initialised at the identity tends to drop the shallow
    modes of a multimodal target; starting hot (where the modes are connected) and cooling to
    :math:`T_1` over the first ``until`` fraction of training keeps them (annealing, as in
    Rezende & Mohamed 2015 and normflows' ``beta``).

    Args:
        progress: fraction of training done, in ``[0, 1]``.
        start: initial temperature :math:`T_0`.
        end: final temperature :math:`T_1`.
        until: fraction of training after which the temperature stays at ``end``.

    Example:
        >>> [round(annealed_temperature(p), 3) for p in (0.0, 0.3, 0.6, 1.0)]
        [4.0, 2.0, 1.0, 1.0]
    """
    if not (start > 0 and end > 0 and 0 < until <= 1):
        raise ValueError(
            f"annealed_temperature: expected positive temperatures and 0 < until <= 1, got {start}, {end}, {until}"
        )
    s = min(1.0, max(0.0, progress) / until)
    return start ** (1 - s) * end**s


def linlog_energy(u: Tensor, cut: float) -> Tensor:
    r"""Energy regularisation for training: :math:`u` below the cut :math:`c`, :math:`c + \log(1 + u - c)` above.

    FAB's "linlogcut" (Midgley et al. 2023).

    Keeps the gradients of rare high-energy samples (overlapping atoms of a molecule) finite while
    leaving :math:`u` exact where it matters. The excess is capped at :math:`10^{30}`, so a sample
    of infinite energy (coinciding atoms) counts :math:`c + \log(1 + 10^{30})` with a zero gradient
    instead of making the loss infinite.

    Example:
        >>> import torch
        >>> [round(v, 4) for v in linlog_energy(torch.tensor([1.0, 11.0]), 10.0).tolist()]
        [1.0, 10.6931]
    """
    excess = (u - cut).clamp(min=0.0, max=1e30)
    return torch.where(u > cut, cut + torch.log1p(excess), u)


def reverse_kl_loss(
    flow: Flow, target: EnergyTarget, n: int, *, temperature: float = 1.0, energy_cut: float | None = None
) -> tuple[Tensor, Tensor]:
    r"""Reverse-KL (energy) loss :math:`\frac1n \sum_i [\log q(x_i) + u(x_i)/T]` on ``n`` reparameterised samples.

    Args:
        flow: the model (any :class:`~flows.flow.Flow`, stochastic blocks included).
        target: the energy :math:`u`.
        n: number of samples.
        temperature: :math:`T`; the loss targets :math:`e^{-u/T}`.
        energy_cut: if given, the loss uses :func:`linlog_energy` of :math:`u/T` above this value
            (the returned log weights stay exact).

    Returns:
        ``(loss, log_w)``: the scalar loss and the detached log importance weights
        :math:`-u(x_i)/T - \log q(x_i)` (for ESS and :math:`\log Z_T` monitoring).

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import Gaussian
        >>> loss, log_w = reverse_kl_loss(Flow(Affine(2), StandardNormal(2)), Gaussian(2), 64)
        >>> abs(loss.item()) < 1e-5  # KL = 0 and log Z = 0: the model is the target
        True
    """
    temperature = _check_temperature(temperature, "reverse_kl_loss")
    check_count("reverse_kl_loss", "n", n)
    x, log_q = flow.sample_and_log_prob((n,))
    energy = target.energy(x) / temperature
    log_w = -(energy + log_q)
    if energy_cut is None:
        return -log_w.mean(), log_w.detach()
    return (linlog_energy(energy, float(energy_cut)) + log_q).mean(), log_w.detach()


def forward_kl_loss(flow: Flow, x: Tensor, *, log_w: Tensor | None = None) -> Tensor:
    r"""Forward-KL (maximum-likelihood) loss :math:`-\frac1n \sum_i \log q(x_i)` on samples of the target.

    With ``log_w`` (samples from another distribution, e.g. another temperature, with log weights
    towards the target) the mean is self-normalised: :math:`-\sum_i \tilde w_i \log q(x_i)`.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> round(forward_kl_loss(Flow(Affine(2), StandardNormal(2)), torch.zeros(3, 2)).item(), 4)
        1.8379
    """
    log_q = flow.log_prob(x)
    if log_w is None:
        return -log_q.mean()
    if log_w.shape != log_q.shape:
        raise ValueError(f"forward_kl_loss: expected log_w of shape {tuple(log_q.shape)}, got {tuple(log_w.shape)}")
    return -(torch.softmax(log_w.detach(), 0) * log_q).sum()


def _seeded_log_weights(model: nn.Module, target: EnergyTarget, n: int, seed: int, temperature: float):
    r"""``n`` samples of ``model`` drawn from ``seed`` (the global RNG untouched) and their :math:`-u/T - \log q`."""
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        x, log_w = sample_log_weights(model, target, n)
    if temperature != 1.0:
        log_w = log_w + target.energy(x) * (1.0 - 1.0 / temperature)
    return x, log_w


class ReverseKL(Objective):
    r"""Objective: reverse KL to an energy target at temperature :math:`T` (needs no data).

    Each call draws ``batch_size`` samples from the model and returns the loss of
    :func:`reverse_kl_loss` with the metrics ``ess`` (Kish, in ``[0, 1]``) and ``log_z`` (the
    batch's :math:`\log Z_T` estimate). :meth:`evaluate` draws ``eval_samples`` samples from a
    fixed seed (comparable across validations) and reports ``loss``, ``ess``, ``log_z``,
    ``log_z_stderr`` and, when the target's ``log_Z`` is known and :math:`T = 1`, ``log_z_error``.

    Args:
        target: the energy target.
        batch_size: samples per training step.
        temperature: :math:`T` (a plain attribute: change it between steps to anneal).
        eval_samples: samples drawn by :meth:`evaluate`.
        eval_seed: seed of those samples.
        energy_cut: train on :func:`linlog_energy` of :math:`u/T` above this value (``None``:
            the exact energy); metrics and :meth:`evaluate` use the exact energy.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import Gaussian
        >>> objective = ReverseKL(Gaussian(2, loc=1.0), batch_size=32)
        >>> flow = Flow(Affine(2), StandardNormal(2))
        >>> loss, metrics = objective(flow, None)
        >>> sorted(metrics)
        ['ess', 'log_z']
        >>> abs(objective.evaluate(flow, [None])["log_z_error"]) < 0.05  # log Z is right even for a poor model
        True
    """

    def __init__(
        self,
        target: EnergyTarget,
        *,
        batch_size: int = 256,
        temperature: float = 1.0,
        eval_samples: int = 10_000,
        eval_seed: int = 0,
        energy_cut: float | None = None,
    ) -> None:
        if energy_cut is not None and not (isinstance(energy_cut, (int, float)) and math.isfinite(energy_cut)):
            raise ValueError(f"ReverseKL: expected a finite energy_cut or None, got {energy_cut!r}")
        self.energy_cut = energy_cut
        target = as_target(target, "ReverseKL")
        if not isinstance(batch_size, int) or batch_size < 1 or not isinstance(eval_samples, int) or eval_samples < 2:
            raise ValueError(
                f"ReverseKL: expected batch_size >= 1 and eval_samples >= 2, got {batch_size!r}, {eval_samples!r}"
            )
        check_count("ReverseKL", "eval_seed", eval_seed, minimum=None, maximum=SEED_MAX)
        self.target, self.batch_size, self.eval_samples, self.eval_seed = target, batch_size, eval_samples, eval_seed
        self.temperature = _check_temperature(temperature, "ReverseKL")

    def __call__(self, model: nn.Module, batch: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        loss, log_w = reverse_kl_loss(
            model, self.target, self.batch_size, temperature=self.temperature, energy_cut=self.energy_cut
        )
        log_z, _ = log_z_estimate(log_w)
        return loss, {"ess": kish_ess(log_w), "log_z": log_z}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: Iterable[object] = ()) -> dict[str, float]:
        """Loss, ESS and log Z at the objective's temperature (with its standard error) on fresh samples."""
        _, log_w = _seeded_log_weights(model, self.target, self.eval_samples, self.eval_seed, self.temperature)
        log_z, stderr = log_z_estimate(log_w)
        out = {
            "loss": float(-log_w.mean()),
            "ess": float(kish_ess(log_w)),
            "log_z": float(log_z),
            "log_z_stderr": float(stderr),
        }
        if self.target.log_Z is not None and self.temperature == 1.0:
            out["log_z_error"] = float(log_z) - self.target.log_Z
        return out

    def __repr__(self) -> str:
        return f"ReverseKL({type(self.target).__name__}, batch_size={self.batch_size}, temperature={self.temperature})"


class ForwardKL(MaximumLikelihood):
    r"""Objective: forward KL (maximum likelihood) on samples of the target.

    :class:`~flows.train.MaximumLikelihood` on the batch when there is one (reference or MD
    samples); with ``batch=None`` it draws ``batch_size`` exact samples from ``target`` (which needs
    an exact sampler), so it trains without a data set. :meth:`evaluate` averages the loss over the
    given batches, or over ``eval_samples`` exact samples from a fixed seed when there are none.

    Args:
        target: target with an exact sampler (``None`` when batches are always given).
        batch_size: exact samples per step when ``batch`` is ``None``.
        eval_samples: exact samples used by :meth:`evaluate` without batches.
        eval_seed: seed of those samples.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import Gaussian
        >>> objective = ForwardKL(Gaussian(2), batch_size=4096)
        >>> loss = objective(Flow(Affine(2), StandardNormal(2)), None)
        >>> abs(loss.item() - math.log(2 * math.pi * math.e)) < 0.1  # the entropy of N(0, I)
        True
    """

    def __init__(
        self,
        target: EnergyTarget | None = None,
        *,
        batch_size: int = 256,
        eval_samples: int = 10_000,
        eval_seed: int = 0,
    ) -> None:
        if target is not None and not target.has_exact_sampler:
            raise ValueError(
                f"ForwardKL: {type(target).__name__} has no exact sampler; pass reference samples as batches instead"
            )
        check_count("ForwardKL", "batch_size", batch_size)
        super().__init__(eval_seed=eval_seed)
        self.target, self.batch_size, self.eval_samples = target, batch_size, eval_samples

    def _exact(self, n: int) -> tuple[Tensor]:
        if self.target is None:
            raise ValueError("ForwardKL: got no batch and has no target to draw exact samples from")
        return (self.target.sample(n),)

    def __call__(self, model: nn.Module, batch: object = None) -> ObjectiveOutput:
        return super().__call__(model, self._exact(self.batch_size) if batch is None else batch)

    def evaluate(self, model: nn.Module, batches: Iterable[object] = ()) -> dict[str, float]:
        """Mean negative log-likelihood over the batches (or fresh exact samples from a fixed seed)."""
        batches = [b for b in batches if b is not None]
        if batches:
            with torch.no_grad():
                return super().evaluate(model, batches)
        devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.eval_seed)
            batch = self._exact(self.eval_samples)
        with torch.no_grad():
            return {"loss": float(-model.log_prob(batch[0]).mean())}

    def __repr__(self) -> str:
        name = type(self.target).__name__ if self.target is not None else None
        return f"ForwardKL({name}, batch_size={self.batch_size})"


class ImportanceForwardKL(Objective):
    r"""Objective: forward KL to an energy target by self-normalised importance sampling, with mode-jumping moves.

    The proposal is the model mixed with its images under ``M`` fixed bijections :math:`S_m` of the
    model's space (the *moves*):

    .. math::
        r(x) = (1 - \varepsilon)\, q(x) + \frac{\varepsilon}{M} \sum_m q\big(S_m^{-1}(x)\big)
        \big|\det J_{S_m^{-1}}(x)\big|,

    exact because each :math:`S_m` is a bijection with a known log-det (a
    :class:`~flows.bijections.CircularShift` of one torsion has log-det 0). Each step draws
    ``batch_size`` samples from :math:`r` without gradients (a fraction ``move_fraction`` of them
    moved, in equal shares per move), weighs them by :math:`w_i \propto e^{-u(x_i)/T} / r(x_i)` and
    returns :math:`L = -\sum_i \tilde w_i \log q(x_i)` (:math:`\tilde w` the normalised weights),
    whose gradient is a consistent estimate of the gradient of :math:`\mathrm{KL}(\pi \,\|\, q)`.
    It is mass-covering like maximum likelihood but needs no data; with moves that carry samples
    from a mode the model has into one it misses (for alanine dipeptide, :math:`\phi` turned from
    basin A into basin B), the missing mode's weights pull mass there, which the reverse KL cannot
    do because it never samples the missing mode. Without moves it is the plain importance-sampled
    forward KL. Mix it with :class:`ReverseKL` (sharpening) or maximum likelihood on data through
    :class:`~flows.train.WeightedSum`.

    Metrics: ``ess`` (Kish, of the proposal's weights) and ``moved_weight`` (the normalised weight
    that the moved samples carry). :meth:`evaluate` reports the loss and ESS of the model alone on
    ``eval_samples`` samples from a fixed seed.

    References:
        Tjelmeland, Hegstad (2001), "Mode jumping proposals in MCMC", Scandinavian Journal of
        Statistics 28 (deterministic moves between modes).
        Müller, McWilliams, Rousselle, Gross, Novák (2019), "Neural importance sampling", ACM TOG,
        arXiv:1808.03856 (the importance-sampled forward KL).

    Args:
        target: the energy :math:`u`, in the model's space.
        moves: bijections of the model's space (``forward_and_log_det`` / ``inverse_and_log_det``).
        move_fraction: :math:`\varepsilon \in [0, 1)` (ignored without moves).
        batch_size: proposal samples per step.
        temperature: :math:`T` (a plain attribute, so :class:`AnnealTemperature` can drive it).
        eval_samples: samples drawn by :meth:`evaluate`.
        eval_seed: seed of those samples.

    Example:
        >>> import math, torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import Gaussian
        >>> _ = torch.manual_seed(0)
        >>> objective = ImportanceForwardKL(Gaussian(2, loc=0.5), batch_size=4096)
        >>> loss, metrics = objective(Flow(Affine(2), StandardNormal(2)), None)
        >>> abs(loss.item() - (math.log(2 * math.pi) + 1.25)) < 0.15  # E_pi[-log q] = log 2pi + (2 + |mu|^2)/2
        True
    """

    def __init__(
        self,
        target: EnergyTarget,
        *,
        moves: Iterable[nn.Module] = (),
        move_fraction: float = 0.5,
        batch_size: int = 256,
        temperature: float = 1.0,
        eval_samples: int = 10_000,
        eval_seed: int = 0,
    ) -> None:
        self.target = as_target(target, "ImportanceForwardKL")
        self.moves = list(moves)
        for move in self.moves:
            if not (
                callable(getattr(move, "forward_and_log_det", None))
                and callable(getattr(move, "inverse_and_log_det", None))
            ):
                raise TypeError(f"ImportanceForwardKL: expected bijections as moves, got {type(move).__name__}")
        if not (isinstance(move_fraction, (int, float)) and 0.0 <= move_fraction < 1.0):
            raise ValueError(f"ImportanceForwardKL: expected move_fraction in [0, 1), got {move_fraction!r}")
        check_count("ImportanceForwardKL", "batch_size", batch_size, minimum=2)
        check_count("ImportanceForwardKL", "eval_samples", eval_samples, minimum=2)
        check_count("ImportanceForwardKL", "eval_seed", eval_seed, minimum=None, maximum=SEED_MAX)
        self.move_fraction = float(move_fraction) if self.moves else 0.0
        self.batch_size, self.eval_samples, self.eval_seed = batch_size, eval_samples, eval_seed
        self.temperature = _check_temperature(temperature, "ImportanceForwardKL")

    @torch.no_grad()
    def _draw(self, model: Flow) -> tuple[Tensor, Tensor]:
        """``batch_size`` samples of r and a mask of the moved ones."""
        n_moved = (
            [round(self.move_fraction * self.batch_size / len(self.moves))] * len(self.moves) if self.moves else []
        )
        x = model.sample((self.batch_size,))
        parts, start = [x[sum(n_moved) :]], 0
        for move, count in zip(self.moves, n_moved, strict=True):
            parts.append(move.forward_and_log_det(x[start : start + count])[0])
            start += count
        moved = torch.zeros(self.batch_size, dtype=torch.bool, device=x.device)
        moved[len(parts[0]) :] = True
        return torch.cat(parts), moved

    @torch.no_grad()
    def _log_proposal(self, model: Flow, x: Tensor, log_q: Tensor) -> Tensor:
        """The proposal's log-density at ``x``, given the model's ``log_q`` there (a pass per move)."""
        terms = [math.log1p(-self.move_fraction) + log_q.detach()]
        for move in self.moves:
            back, ladj = move.inverse_and_log_det(x)
            terms.append(math.log(self.move_fraction / len(self.moves)) + model.log_prob(back) + ladj)
        return torch.logsumexp(torch.stack(terms), 0)

    def _propose(self, model: Flow) -> tuple[Tensor, Tensor, Tensor]:
        """Samples of r, their log r and a mask of the moved ones."""
        x, moved = self._draw(model)
        with torch.no_grad():
            return x, self._log_proposal(model, x, model.log_prob(x)), moved

    def __call__(self, model: nn.Module, batch: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        x, moved = self._draw(model)
        log_q = model.log_prob(x)  # one pass serves the loss and the proposal's density
        log_w = -self.target.energy(x).detach() / self.temperature - self._log_proposal(model, x, log_q)
        log_w = torch.where(torch.isnan(log_w), -math.inf, log_w)
        if not bool(torch.isfinite(log_w).any()):
            raise ValueError("ImportanceForwardKL: every proposal sample has weight 0 (infinite or NaN energy)")
        weights = torch.softmax(log_w, 0)
        keep = weights > 0  # zero-weight rows (energy +inf) may have -inf log q: keep them out of 0 * inf
        loss = -(weights[keep] * log_q[keep]).sum()
        return loss, {"ess": kish_ess(log_w), "moved_weight": weights[moved].sum()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: Iterable[object] = ()) -> dict[str, float]:
        """Loss and Kish ESS of the model alone (its own samples, no moves) from a fixed seed."""
        x, log_w = _seeded_log_weights(model, self.target, self.eval_samples, self.eval_seed, self.temperature)
        finite = torch.isfinite(log_w)
        weights = torch.softmax(torch.where(finite, log_w, -math.inf), 0)
        log_q = -self.target.energy(x[finite]) / self.temperature - log_w[finite]
        loss = -(weights[finite] * log_q).sum()
        return {"loss": float(loss), "ess": float(kish_ess(log_w))}

    def __repr__(self) -> str:
        return (
            f"ImportanceForwardKL({type(self.target).__name__}, moves={len(self.moves)}, "
            f"move_fraction={self.move_fraction}, batch_size={self.batch_size}, temperature={self.temperature})"
        )


class AnnealTemperature(Callback):
    r"""Trainer callback: anneal a temperature by :func:`annealed_temperature`.

    It drives the ``temperature`` attribute of a :class:`ReverseKL` objective or of a
    :class:`~flows.targets.TemperedEnergy` (use the latter when the flow has stochastic blocks, so
    that blocks and loss see the same tempered target).

    Progress is ``trainer.step / steps`` or, with ``seconds``, ``trainer.elapsed / seconds`` (both
    restored on resume, so the callback has no state of its own). The temperature is set before
    the first step and after every step.

    Args:
        objective: the object whose ``temperature`` attribute to drive.
        steps: steps over which progress runs from 0 to 1 (give this or ``seconds``).
        seconds: training seconds over which progress runs from 0 to 1.
        start, end, until: see :func:`annealed_temperature`.

    Example:
        >>> from flows.targets import DoubleWell
        >>> objective = ReverseKL(DoubleWell())
        >>> callback = AnnealTemperature(objective, steps=100)
        >>> class FakeTrainer:
        ...     step, elapsed = 30, 0.0
        >>> callback.on_step_end(FakeTrainer(), {})
        >>> objective.temperature
        2.0
    """

    def __init__(
        self,
        objective: ReverseKL | TemperedEnergy,
        *,
        steps: int | None = None,
        seconds: float | None = None,
        start: float = 4.0,
        end: float = 1.0,
        until: float = 0.6,
    ) -> None:
        if (steps is None) == (seconds is None):
            raise ValueError(f"AnnealTemperature: expected exactly one of steps and seconds, got {steps}, {seconds}")
        horizon = steps if steps is not None else seconds
        if not horizon > 0:
            raise ValueError(f"AnnealTemperature: expected a positive horizon, got {horizon}")
        annealed_temperature(0.0, start=start, end=end, until=until)  # validates the schedule
        self.objective, self.steps, self.seconds = objective, steps, seconds
        self.start, self.end, self.until = start, end, until

    def _update(self, trainer: object) -> None:
        progress = trainer.step / self.steps if self.steps is not None else trainer.elapsed / self.seconds
        self.objective.temperature = annealed_temperature(progress, start=self.start, end=self.end, until=self.until)

    def on_fit_start(self, trainer: object) -> None:
        self._update(trainer)

    def on_step_end(self, trainer: object, metrics: dict[str, float]) -> None:
        self._update(trainer)
