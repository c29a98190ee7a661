"""sbi's NPE with flows' MAF/NSF (``flows.interop.sbi.builder``) against sbi's own density estimators.

Contenders, each trained by sbi's ``NPE`` on the same simulations with sbi's trainer and defaults
(batch 200, Adam 5e-4, early stopping after 20 epochs without validation improvement, at most
``--epochs``): flows ``MAF`` (5 transforms, hidden (50, 50)) and ``NSF`` (5 transforms, hidden
(50, 50), 10 bins) through the builder; sbi's ``"maf"`` and ``"nsf"`` (nflows, 5 transforms,
50 hidden features, 10 bins) and ``"zuko_maf"``/``"zuko_nsf"`` (zuko) from ``posterior_nn``.

Simulators, both with an exact posterior:

* **linear Gaussian**: θ ~ N(0, I₂), x | θ ~ N(θ, σ² I), σ = 0.5, so p(θ | x) = N(x/(1+σ²), σ²/(1+σ²) I);
* **Gaussian mixture** (sbi's ``gaussian_mixture``, from sbibm): θ ~ U(−10, 10)², x | θ ~ ½ N(θ, I) + ½ N(θ, 0.01 I),
  so p(θ | x) = ½ N(x, I) + ½ N(x, 0.01 I) (truncation to the box negligible at the observations used).

Score: KL(p ‖ q) = E_p[log p(θ | x_o) − log q(θ | x_o)] by Monte Carlo over ``--kl-samples`` exact
posterior draws, averaged over ``--observations`` observations x_o simulated from the prior
predictive (|x_o| < 3 for the mixture); CPU seconds of the training (``time.process_time``). The
contenders run interleaved (seed by seed, each contender in turn) on one thread; medians over seeds.

    nice -n 5 python benchmarks/sbi_npe.py                       # the table of docs/ecosystem.md
    python benchmarks/sbi_npe.py --seeds 1 --simulations 200 --epochs 2 --models "flows MAF"   # a smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings

import torch
from torch.distributions import MultivariateNormal

SIGMA = 0.5
MODELS = ("flows MAF", "flows NSF", "sbi maf (nflows)", "sbi nsf (nflows)", "sbi zuko_maf", "sbi zuko_nsf")


def _estimator(name: str):
    from sbi.neural_nets import posterior_nn

    from flows.interop.sbi import builder

    if name == "flows MAF":
        return builder("maf", transforms=5, hidden=(50, 50))
    if name == "flows NSF":
        return builder("nsf", transforms=5, hidden=(50, 50), bins=10)
    model = name.split()[1]
    return posterior_nn(model=model, hidden_features=50, num_transforms=5, num_bins=10)


class LinearGaussian:
    """θ ~ N(0, I₂), x | θ ~ N(θ, σ² I)."""

    name = "linear Gaussian"

    def __init__(self) -> None:
        self.prior = MultivariateNormal(torch.zeros(2), torch.eye(2))

    def simulate(self, theta: torch.Tensor) -> torch.Tensor:
        return theta + SIGMA * torch.randn_like(theta)

    def posterior(self, x_o: torch.Tensor) -> MultivariateNormal:
        return MultivariateNormal(x_o / (1 + SIGMA**2), SIGMA**2 / (1 + SIGMA**2) * torch.eye(2))


class _Mixture:
    """½ N(x_o, I) + ½ N(x_o, 0.01 I) with ``sample`` and ``log_prob``."""

    def __init__(self, x_o: torch.Tensor) -> None:
        self.parts = [MultivariateNormal(x_o, s**2 * torch.eye(2)) for s in (1.0, 0.1)]

    def sample(self, shape: tuple[int]) -> torch.Tensor:
        draws = torch.stack([p.sample(shape) for p in self.parts])
        pick = torch.randint(0, 2, shape)
        return draws[pick, torch.arange(shape[0])]

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(torch.stack([p.log_prob(theta) for p in self.parts]), 0) - math.log(2)


class GaussianMixture:
    """sbi's ``gaussian_mixture`` simulator with a U(−10, 10)² prior."""

    name = "Gaussian mixture"

    def __init__(self) -> None:
        from sbi.simulators.gaussian_mixture import uniform_prior_gaussian_mixture

        self.prior = uniform_prior_gaussian_mixture(2)

    def simulate(self, theta: torch.Tensor) -> torch.Tensor:
        from sbi.simulators.gaussian_mixture import gaussian_mixture

        return gaussian_mixture(theta)

    def posterior(self, x_o: torch.Tensor) -> _Mixture:
        return _Mixture(x_o)


def _observations(task, n: int) -> list[torch.Tensor]:
    out = []
    while len(out) < n:
        x = task.simulate(task.prior.sample((1,)))[0]
        if x.abs().max() < 3:
            out.append(x)
    return out


def _train(task, model: str, theta, x, epochs: int):
    from sbi.inference import NPE
    from torch.utils.tensorboard import SummaryWriter

    start = time.process_time()
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as logs:  # not sbi's default ./sbi-logs
        warnings.simplefilter("ignore")
        writer = SummaryWriter(logs)
        npe = NPE(task.prior, density_estimator=_estimator(model), show_progress_bars=False, summary_writer=writer)
        estimator = npe.append_simulations(theta, x).train(max_num_epochs=epochs, training_batch_size=200)
        writer.close()
    return estimator, time.process_time() - start, npe._summary["epochs_trained"][-1]


@torch.no_grad()
def _kl(task, estimator, observations, samples: int) -> float:
    values = []
    for x_o in observations:
        p = task.posterior(x_o)
        theta = p.sample((samples,))
        log_q = estimator.log_prob(theta.unsqueeze(1), x_o.unsqueeze(0))[:, 0]
        values.append(float((p.log_prob(theta) - log_q).mean()))
    return statistics.fmean(values)


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--simulations", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--observations", type=int, default=3)
    parser.add_argument("--kl-samples", type=int, default=4000)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--tasks", nargs="+", default=["linear", "mixture"], choices=["linear", "mixture"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tasks = {"linear": LinearGaussian, "mixture": GaussianMixture}
    results: dict[str, dict[str, dict[str, float]]] = {}
    warm = LinearGaussian()  # untimed: first calls import and compile what each contender needs
    for model in args.models:
        theta = warm.prior.sample((200,))
        _train(warm, model, theta, warm.simulate(theta), 1)
    for key in args.tasks:
        task = tasks[key]()
        runs: dict[str, list[tuple[float, float, int]]] = {m: [] for m in args.models}
        for seed in range(args.seeds):
            torch.manual_seed(1000 + seed)
            theta = task.prior.sample((args.simulations,))
            x = task.simulate(theta)
            observations = _observations(task, args.observations)
            for model in args.models:  # interleaved: every contender on this seed's data before the next seed
                torch.manual_seed(seed)
                estimator, seconds, epochs = _train(task, model, theta, x, args.epochs)
                runs[model].append((_kl(task, estimator, observations, args.kl_samples), seconds, epochs))
        results[task.name] = {
            m: {
                "kl": statistics.median(r[0] for r in v),
                "cpu_s": statistics.median(r[1] for r in v),
                "epochs": statistics.median(r[2] for r in v),
            }
            for m, v in runs.items()
        }
        print(f"\n{task.name}: {args.simulations} simulations, {args.seeds} seeds (medians), 1 thread")
        print(f"| {'density estimator':<18} | KL(p ‖ q) | CPU s | epochs |")
        print(f"|{'-' * 20}|----------:|------:|-------:|")
        for m, r in results[task.name].items():
            print(f"| {m:<18} | {r['kl']:9.3f} | {r['cpu_s']:5.1f} | {r['epochs']:6.0f} |")
    return results


if __name__ == "__main__":
    main()
