"""NanoFlow parameter sharing on digits: parameters vs test bits/dim against the unshared flow.

Two families: RealNVP on the 64 pixels behind a logit layer, and Glow on the 1×8×8 images
(2 levels × 4 steps, its own logit preprocessing). Every model is trained by maximum likelihood on
uniformly dequantized digits (split ``train_test_split(test_size=0.2, random_state=0)``, batch
128, Adam 1e-3, fixed epochs, no early stopping) and scored by test bits/dim (17 levels, 10
dequantization draws). Unshared models have one conditioner per coupling; shared ones have one
conditioner (per mask shape, or per Glow level) for all couplings, plus a per-step embedding and
gate (``share_conditioner=True``). Models are trained in turn for each seed.

    python benchmarks/sharing.py                          # RealNVP family, 60 epochs, 3 seeds
    python benchmarks/sharing.py --family glow --epochs 30
    python benchmarks/sharing.py --epochs 2 --seeds 1
"""

from __future__ import annotations

import statistics
import time

import _harness
import torch

import flows
from flows.data import DIGITS_LEVELS, load_digits
from flows.train import MaximumLikelihood, Trainer
from flows.train.runs import evaluate_log_likelihood

GLOW_MODELS = {
    "glow unshared h=32": {"hidden": (32, 32)},
    "glow unshared h=64": {"hidden": (64, 64)},
    "glow shared h=64": {"hidden": (64, 64), "share_conditioner": True},
    "glow shared h=96": {"hidden": (96, 96), "share_conditioner": True},
}

MODELS = {
    "unshared K=8 h=256": {"transforms": 8, "hidden": (256, 256)},
    "shared K=8 h=256": {"transforms": 8, "hidden": (256, 256), "share_conditioner": True},
    "shared K=16 h=256": {"transforms": 16, "hidden": (256, 256), "share_conditioner": True},
    "shared K=8 h=512": {"transforms": 8, "hidden": (512, 512), "share_conditioner": True},
    # the honest control: an unshared flow shrunk to the shared model's size
    "unshared K=8 h=64": {"transforms": 8, "hidden": (64, 64)},
}


def build(name: str) -> flows.Flow:
    if name in GLOW_MODELS:
        return flows.Glow((1, 8, 8), scales=2, steps=4, **GLOW_MODELS[name])
    realnvp = flows.RealNVP(64, **MODELS[name])
    return flows.Flow(flows.Chain(flows.Logit(64, alpha=0.05), realnvp.transform), realnvp.base)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = _harness.parser(__doc__, seed=None, epochs=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--family", choices=["realnvp", "glow"], default="realnvp")
    parser.add_argument("--models", nargs="*", default=None, help="subset of the model names (default: the family's)")
    args = _harness.setup(parser.parse_args(argv))

    if args.models is None:
        args.models = list(GLOW_MODELS if args.family == "glow" else MODELS)
    unknown = [m for m in args.models if m not in MODELS and m not in GLOW_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; expected names from {[*MODELS, *GLOW_MODELS]}")
    image = any(m in GLOW_MODELS for m in args.models)
    if image and any(m in MODELS for m in args.models):
        parser.error("compare models of one family at a time (vectors vs images)")
    train, test = load_digits(test_size=0.2, seed=0, image=image)
    results: dict[str, dict[str, list[float]]] = {name: {"bpd": [], "time": []} for name in args.models}
    params: dict[str, int] = {}
    for seed in range(args.seeds):
        for name in args.models:  # interleaved over seeds
            torch.manual_seed(seed)
            model = build(name)
            params[name] = sum(p.numel() for p in model.parameters())
            start = time.perf_counter()
            Trainer(model, MaximumLikelihood(levels=DIGITS_LEVELS), lr=1e-3, progress=False).fit(
                train, None, epochs=args.epochs, batch_size=128, seed=seed
            )
            results[name]["time"].append(time.perf_counter() - start)
            score = evaluate_log_likelihood(model, test, levels=DIGITS_LEVELS, draws=10, seed=seed)
            results[name]["bpd"].append(score["bits_per_dim"])

    reference = args.models[0]
    print(f"digits, {args.epochs} epochs, {args.seeds} seed(s), {args.threads} thread(s)")
    print(f"{'model':<22} {'params':>10} {'x fewer':>8} {'test bpd':>16} {'train s':>8}")
    summary = {}
    for name in args.models:
        bpd = results[name]["bpd"]
        spread = statistics.stdev(bpd) if len(bpd) > 1 else 0.0
        summary[name] = {
            "params": params[name],
            "bpd": statistics.fmean(bpd),
            "time": statistics.median(results[name]["time"]),
        }
        print(
            f"{name:<22} {params[name]:10,d} {params[reference] / params[name]:8.2f} "
            f"{statistics.fmean(bpd):8.3f} ± {spread:5.3f} {summary[name]['time']:8.1f}"
        )
    return summary


if __name__ == "__main__":
    main()
