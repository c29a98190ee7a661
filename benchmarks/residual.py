"""Residual flows against normflows' at equal wall clock on the digits table: test NLL, step time, log-det cost.

Contenders (``normflows`` needs ``pip install normflows``, in the ``bench`` extra):

* ``flows``: ``flows.ResidualFlow(64, transforms=4, hidden=(128, 128), coefficient=0.9)``, which
  trains with the Russian-roulette log-det (``D = 64 > 16``) and the Neumann gradient;
* ``normflows``: 4 × [``normflows.flows.Residual(LipschitzMLP([64, 128, 128, 64],
  lipschitz_const=0.9), reduce_memory=True)``, ``ActNorm``], the same estimator settings (2 exact
  terms, geometric(0.5), one probe) and a fixed standard normal base. normflows' Lipschitz layers
  normalise with *stored* power-iteration vectors (``InducedNormLinear.forward`` never updates
  them); its training loop must call ``normflows.utils.update_lipschitz(model, n)`` after each
  optimiser step, as its examples do. Here ``n = 5`` (its layers' default), counted in the step
  time. Without it the constraint is not enforced (effective spectral norms of 1.8-2.3 after 60
  steps were measured against the bound 0.9: the flow is then not guaranteed invertible).

Data: the 8×8 digits (1797 × 64 integer levels 0–16) dequantised once with uniform noise, divided
by 17 and standardised with the training statistics; the library's fixed train/test split. Adam
lr 1e-3, batch 128, float32, one thread, steps interleaved in chunks (the contender with the least
training time goes next) until each has trained ``--budget`` seconds. The test NLL (nats per
image, on the dequantised, standardised scale: **not** bits/dim and not comparable to published
numbers) is computed for both the same way, with the **exact** log-det of each model's data →
latent map (64 backward passes per batch), so the estimators' noise does not enter it.

    python benchmarks/residual.py --budget 90      # ~5 minutes
    python benchmarks/residual.py --budget 1 --contenders flows   # smoke

Measured figures: docs/residual.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

CONTENDERS = ("flows", "normflows")


def _digits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from flows.data import load_dataset

    ds = load_dataset("digits")
    g = torch.Generator().manual_seed(seed)
    train = (ds.train.float() + torch.rand(ds.train.shape, generator=g)) / 17
    test = (ds.test.float() + torch.rand(ds.test.shape, generator=g)) / 17
    mean, std = train.mean(0), train.std(0).clamp_min(1e-3)
    return (train - mean) / std, (test - mean) / std


def _ours() -> tuple[torch.nn.Module, Callable, Callable]:
    import flows

    model = flows.ResidualFlow(64, transforms=4, hidden=(128, 128), coefficient=0.9, actnorm=True)
    block = next(m for m in model.modules() if isinstance(m, flows.ResidualBlock))

    def to_latent(x):
        return model.transform(x)

    return model, model.log_prob, (to_latent, model.base.log_prob), lambda x: block.forward_and_log_det(x)[1], None


def _normflows() -> tuple[torch.nn.Module, Callable, Callable]:
    import normflows as nf

    layers = []
    for _ in range(4):
        net = nf.nets.LipschitzMLP([64, 128, 128, 64], lipschitz_const=0.9, init_zeros=True)
        layers += [nf.flows.Residual(net, reduce_memory=True, n_exact_terms=2, geom_p=0.5), nf.flows.ActNorm(64)]
    model = nf.NormalizingFlow(q0=nf.distributions.DiagGaussian(64, trainable=False), flows=layers)

    def to_latent(x):
        return model.inverse(x)

    def base_log_prob(z):
        return model.q0.log_prob(z)

    block = model.flows[0]  # data -> latent is Residual.inverse (iResBlock.forward: x + g(x))

    def after_step():  # normflows' layers use stored power-iteration vectors: its training loop updates them
        nf.utils.update_lipschitz(model, 5)

    return model, model.log_prob, (to_latent, base_log_prob), lambda x: block.inverse(x)[1], after_step


def _exact_nll(to_latent: Callable, base_log_prob: Callable, x: torch.Tensor, chunk: int = 100) -> torch.Tensor:
    """Per-row exact -log p(x): the data → latent map's Jacobian by 64 backward passes per chunk."""
    out = []
    for rows in x.split(chunk):
        rows = rows.detach().requires_grad_(True)
        z = to_latent(rows)
        jac = torch.stack(
            [torch.autograd.grad(z[:, i].sum(), rows, retain_graph=True)[0] for i in range(z.shape[1])], 1
        )  # (B, D, D): row i = ∂z_i/∂x
        ladj = torch.linalg.slogdet(jac).logabsdet
        out.append(-(base_log_prob(z) + ladj).detach())
    return torch.cat(out)


class _Run:
    def __init__(self, name: str, train: torch.Tensor, seed: int, batch: int) -> None:
        torch.manual_seed(seed)
        self.name = name
        self.model, self.log_prob, self.exact, self.block_ladj, self.after_step = (
            _ours if name == "flows" else _normflows
        )()
        self.ladj_times: list[float] = []
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.train, self.batch = train, batch
        self.generator = torch.Generator().manual_seed(seed)
        self.step_times: list[float] = []
        self.spent = 0.0

    def steps(self, n: int) -> None:
        self.model.train()
        for _ in range(n):
            rows = torch.randint(len(self.train), (self.batch,), generator=self.generator)
            start = time.perf_counter()
            loss = -self.log_prob(self.train[rows]).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.after_step is not None:
                self.after_step()
            elapsed = time.perf_counter() - start
            self.step_times.append(elapsed)
            self.spent += elapsed

    def time_ladj(self, repeats: int) -> None:
        """Forward + backward of the first residual block's training log-det estimate alone (one batch)."""
        self.model.train()
        for _ in range(repeats):
            rows = torch.randint(len(self.train), (self.batch,), generator=self.generator)
            x = self.train[rows]
            start = time.perf_counter()
            self.block_ladj(x).sum().backward()
            self.ladj_times.append(time.perf_counter() - start)
        self.model.zero_grad()

    def evaluate(self, test: torch.Tensor) -> dict[str, float]:
        self.model.eval()
        nll = _exact_nll(*self.exact, test)
        return {
            "nll": float(nll.mean()),
            "se": float(nll.std() / len(nll) ** 0.5),
            "steps": len(self.step_times),
            "step_ms": 1e3 * statistics.median(self.step_times),
            "ladj_ms": 1e3 * statistics.median(self.ladj_times),
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=90.0, help="training seconds per contender")
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ladj-rounds", type=int, default=10, help="interleaved rounds timing one block's log-det")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, test = _digits(args.seed)
    runs = [_Run(c, train, args.seed, args.batch) for c in args.contenders]
    while any(r.spent < args.budget for r in runs):
        min((r for r in runs if r.spent < args.budget), key=lambda r: r.spent).steps(args.chunk)
    for _ in range(args.ladj_rounds):  # the estimator's own cost, interleaved too
        for r in runs:
            r.time_ladj(5)
    results = {r.name: r.evaluate(test) for r in runs}
    print(f"digits (dequantised, standardised), {args.budget:g} s per contender, 1 thread, batch {args.batch}")
    for name, r in results.items():
        peer = results.get("normflows")
        ratio = f"{r['step_ms'] / peer['step_ms']:.2f}x normflows" if peer and name != "normflows" else ""
        r["step_vs_normflows"] = r["step_ms"] / peer["step_ms"] if ratio else float("nan")
        nll = f"test NLL {r['nll']:9.3f} ± {r['se']:.3f}"
        cost = f"one block's log-det fwd+bwd {r['ladj_ms']:6.2f} ms"
        print(f"{name:<10} {nll}  steps {r['steps']:5d}  step {r['step_ms']:7.1f} ms  {cost}  {ratio}")
    return results


if __name__ == "__main__":
    main()
