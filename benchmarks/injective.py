"""Injective flows: cost of a FIF training step against a plain autoencoder step, and model quality.

Part 1 (``--part cost``): one optimiser step of the FIF loss (encoder VJP at the data point,
decoder JVP, latent log-density, reconstruction) against one step of a plain autoencoder with the
same encoder and decoder (noisy reconstruction loss only), interleaved, medians, on one thread.
Both decoder-JVP modes are timed; so is the exact on-manifold ``log_prob`` (O(d) JVPs + QR) for
reference. The issue's target is a FIF step ≤ 3× the autoencoder step.

Part 2 (``--part quality``): runs ``examples/injective_sine.py`` (curve in R^2, sheet in R^3) and
``examples/injective_tabular.py`` with the given step budget and prints their metrics side by side
(reconstruction error, on-manifold NLL, distance of samples to the manifold, RealNVP for
comparison); the examples write their sample pictures under ``--out``.

    python benchmarks/injective.py --part cost
    python benchmarks/injective.py --part quality --steps 3000      # ~15 min on one core
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import _harness
import torch

import flows

# (name, D, d, hidden width, batch)
CONFIGS = [
    ("sine curve", 2, 1, 128, 256),
    ("sheet in R^3", 3, 2, 128, 256),
    ("tabular", 30, 10, 128, 256),
    ("tabular, wide", 43, 20, 256, 512),
]


def _steps(features: int, latent: int, hidden: int, batch: int) -> dict[str, Callable[[], None]]:
    """Step closures sharing one set of networks (each with its own optimiser)."""
    torch.manual_seed(0)
    models = {
        jvp: flows.FreeFormInjectiveFlow(
            features, latent_features=latent, hidden=(hidden, hidden), noise_std=0.1, jvp=jvp
        )
        for jvp in ("double_backward", "forward")
    }
    models["forward"].load_state_dict(models["double_backward"].state_dict())
    model = models["double_backward"]
    encoder, decoder = model.injective.encoder, model.injective.decoder
    x = torch.randn(batch, features)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, m in models.items()}
    autoencoder_optimizer = torch.optim.Adam([*encoder.parameters(), *decoder.parameters()], lr=1e-5)

    def autoencoder() -> None:
        noisy = x + 0.1 * torch.randn_like(x)
        loss = (decoder(encoder(noisy)) - noisy).square().sum(-1).mean()
        autoencoder_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        autoencoder_optimizer.step()

    def fif(name: str) -> Callable[[], None]:
        def step() -> None:
            loss = models[name].loss(x).mean()
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()

        return step

    def exact_log_prob() -> None:
        with torch.no_grad():
            model.log_prob(x)

    return {
        "autoencoder step": autoencoder,
        "FIF step (double_backward)": fif("double_backward"),
        "FIF step (forward-mode)": fif("forward"),
        "exact log_prob (no grad)": exact_log_prob,
    }


def cost(repeats: int, inner: int, configs: list[tuple[str, int, int, int, int]]) -> dict[str, float]:
    """Print (and return, keyed ``"<config>: <step>"``) the median cost of each step over the autoencoder step."""
    ratios: dict[str, float] = {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); medians of {repeats} interleaved rounds")
    for name, features, latent, hidden, batch in configs:
        steps = _steps(features, latent, hidden, batch)
        medians = _harness.interleaved_medians(steps, rounds=repeats, inner=inner)
        floor = medians["autoencoder step"]
        print(f"\n{name}: D={features} d={latent} hidden={hidden} batch={batch}")
        for key, median in medians.items():
            print(f"  {key:28s} {1e3 * median:8.2f} ms   {median / floor:5.2f}x autoencoder step")
            ratios[f"{name}: {key}"] = median / floor
    return ratios


def quality(steps: int, out: Path, miniboone: bool) -> None:
    runs = [
        ("sine curve in R^2", "injective_sine.py", ["--dim", "1"]),
        ("wavy sheet in R^3", "injective_sine.py", ["--dim", "2"]),
        ("breast cancer (30 → 10)", "injective_tabular.py", ["--dataset", "breast_cancer", "--latent", "10"]),
    ]
    if miniboone:
        runs.append(("MiniBooNE (43 → 21)", "injective_tabular.py", ["--dataset", "miniboone", "--latent", "21"]))
    summary = []
    for label, script, argv in runs:
        print(f"\n=== {label} ===")
        main = _harness.load_example(script).main
        start = time.perf_counter()
        results = main([*argv, "--steps", str(steps), "--out", str(out)])
        summary.append((label, results, time.perf_counter() - start))
    print("\n=== summary ===")
    for label, results, seconds in summary:
        print(f"{label} ({seconds:.0f} s):")
        for key, value in results.items():
            print(f"  {key:32s} {value:10.4f}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = _harness.parser(__doc__, seed=None)
    parser.add_argument("--part", choices=("cost", "quality", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--inner", type=int, default=5, help="steps per timing round")
    parser.add_argument("--steps", type=int, default=3000, help="training steps per model (quality part)")
    parser.add_argument("--miniboone", action="store_true", help="also run MiniBooNE (needs FLOWS_DATA_DIR)")
    parser.add_argument("--tiny", action="store_true", help="one tiny cost configuration (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("runs/injective_benchmark"))
    args = _harness.setup(parser.parse_args(argv))
    ratios: dict[str, float] = {}
    if args.part in ("cost", "all"):
        ratios = cost(args.repeats, args.inner, [("tiny", 3, 2, 8, 16)] if args.tiny else CONFIGS)
    if args.part in ("quality", "all"):
        quality(args.steps, args.out, args.miniboone)
    return ratios


if __name__ == "__main__":
    main()
