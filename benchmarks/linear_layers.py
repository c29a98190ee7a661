"""Invertible linear layers side by side: CirculantDiagonal (CDFlow) vs dense, LU, Glow's 1x1 conv and the FFT floor.

For each size ``n`` the contenders run interleaved, round after round, in one process; the script
prints medians (ms) and ratios. Operations, all without gradient tracking:

* ``fwd+ladj``: ``z = W x`` and ``log|det W|`` (``forward_and_log_det``);
* ``inv+ladj``: ``x = W⁻¹ z`` and its log-det (``inverse_and_log_det``);
* ``ladj``: ``log|det W|`` alone.

Contenders: the bare ``irfft(rfft(x))`` round trip (the floor of one circulant factor),
``CirculantDiagonal`` with ``m = 2, 3, 4`` and ``method="fft"`` (spectra recomputed every call;
``m=3 cached`` reuses them in eval mode; ``m=3 dense`` materialises ``W`` / ``W⁻¹`` from the factors
and applies one matmul or 1x1 convolution), ``LULinear``, a dense matrix (``x @ W.T`` + ``slogdet``;
``solve`` + ``slogdet``) and Glow's 1x1 convolution (``conv2d`` with ``W`` + ``slogdet``; ``conv2d``
with ``inv(W)``).
``--images`` adds the channel form on ``(B, C, H, W)`` images against the 1x1 convolution.

    python benchmarks/linear_layers.py                          # n = 16 ... 4096, ~6 minutes
    python benchmarks/linear_layers.py --sizes 64 1024 --budget 5
    python benchmarks/linear_layers.py --sizes --images             # the channel form only, ~2 minutes
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import _harness
import torch
import torch.nn.functional as F

import flows

OPS = ("fwd+ladj", "inv+ladj", "ladj")


def dense_ops(w: torch.Tensor, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """A general dense matrix: matmul / solve, and a fresh slogdet every call."""
    return {
        "fwd+ladj": lambda: (x @ w.T, torch.linalg.slogdet(w).logabsdet),
        "inv+ladj": lambda: (torch.linalg.solve(w, x.T).T, -torch.linalg.slogdet(w).logabsdet),
        "ladj": lambda: torch.linalg.slogdet(w).logabsdet,
    }


def glow_ops(w: torch.Tensor, x: torch.Tensor, *, image: bool = False) -> dict[str, Callable[[], object]]:
    """Glow's invertible 1x1 convolution: conv2d with W (or with inv(W)) and slogdet, as in openai/glow."""
    xi = x if image else x.view(*x.shape, 1, 1)
    pixels = xi.shape[-2] * xi.shape[-1]
    return {
        "fwd+ladj": lambda: (F.conv2d(xi, w[:, :, None, None]), pixels * torch.linalg.slogdet(w).logabsdet),
        "inv+ladj": lambda: (
            F.conv2d(xi, torch.linalg.inv(w)[:, :, None, None]),
            -pixels * torch.linalg.slogdet(w).logabsdet,
        ),
        "ladj": lambda: torch.linalg.slogdet(w).logabsdet,
    }


def layer_ops(layer: flows.Bijection, x: torch.Tensor, log_abs_det: Callable[[], object]):
    return {
        "fwd+ladj": lambda: layer.forward_and_log_det(x),
        "inv+ladj": lambda: layer.inverse_and_log_det(x),
        "ladj": log_abs_det,
    }


def floor_ops(x: torch.Tensor, dim: int = -1) -> dict[str, Callable[[], object]]:
    n = x.shape[dim]
    return {"fwd+ladj": lambda: torch.fft.irfft(torch.fft.rfft(x, dim=dim), n=n, dim=dim)}


class _LUChannels(flows.LULinear):
    """LULinear applied over the channels of ``(C, H, W)`` images (its ``_spatial`` hook), for comparison."""

    _spatial = 2


def perturb(layer: torch.nn.Module) -> torch.nn.Module:
    """Move a layer off its identity initialisation (timings do not depend on values, but be honest)."""
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return layer.eval()


def contenders(n: int, x: torch.Tensor, *, image: bool = False) -> dict[str, dict[str, Callable[[], object]]]:
    gen = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    w = (q + 0.1 * torch.randn(n, n, generator=gen, dtype=torch.float64) / n**0.5).float()
    cd_class = flows.CirculantDiagonal2d if image else flows.CirculantDiagonal
    table: dict[str, dict[str, Callable[[], object]]] = {"fft floor": floor_ops(x, dim=-3 if image else -1)}
    for m in (2, 3, 4):
        layer = perturb(cd_class(n, factors=m, init="orthogonal", method="fft", generator=gen))
        table[f"CD m={m}"] = layer_ops(layer, x, layer.log_abs_det)
    cached = perturb(cd_class(n, factors=3, init="orthogonal", method="fft", generator=gen, cache=True))
    table["CD m=3 cached"] = layer_ops(cached, x, cached.log_abs_det)
    dense = perturb(cd_class(n, factors=3, init="orthogonal", method="dense", generator=gen))
    table["CD m=3 dense"] = layer_ops(dense, x, dense.log_abs_det)
    lu = perturb(_LUChannels((n, None, None)) if image else flows.LULinear(n))
    table["LU"] = layer_ops(lu, x, lu.log_abs_det)
    if not image:
        table["dense"] = dense_ops(w, x)
    table["Glow 1x1"] = glow_ops(w, x, image=image)
    return table


def measure(table: dict[str, dict[str, Callable[[], object]]], budget: float, max_rounds: int) -> dict:
    """Median seconds per (contender, op), interleaving every contender in each round.

    Within a round a cheap call is repeated back to back until it has run for about 10 ms (at most
    100 times), and every repetition is one sample: on a shared machine this keeps the medians of
    millisecond calls from resting on a handful of samples. The minima are returned too (key
    ``("min", name, op)``): under heavy contention they are the better estimate of the cost itself.
    """
    calls = [(name, op, fn) for name, ops in table.items() for op, fn in ops.items()]
    repeats, round_time = [], 0.0
    for _, _, fn in calls:  # warm-up (allocations, FFT plans)
        fn()
        t0 = time.perf_counter()
        fn()
        elapsed = max(time.perf_counter() - t0, 1e-9)
        repeats.append(int(min(100, max(1, 1e-2 / elapsed))))
        round_time += repeats[-1] * elapsed
    rounds = int(max(3, min(max_rounds, budget / round_time)))
    times: dict[tuple[str, str], list[float]] = {(name, op): [] for name, op, _ in calls}
    for _ in range(rounds):
        for (name, op, fn), inner in zip(calls, repeats, strict=True):
            for _ in range(inner):
                t0 = time.perf_counter()
                fn()
                times[(name, op)].append(time.perf_counter() - t0)
    medians = {key: statistics.median(v) for key, v in times.items()}
    minima = {("min", *key): min(v) for key, v in times.items()}
    return medians | minima | {"rounds": rounds}


def _ratios(r: dict, stat: str) -> list[str]:
    """Ratio lines for one statistic (``"median"`` or ``"min"``)."""
    get = (lambda name, op: r[(name, op)]) if stat == "median" else (lambda name, op: r[("min", name, op)])
    floor = get("fft floor", "fwd+ladj")
    dense = "dense" if ("dense", "ladj") in r else "Glow 1x1"
    lines = []
    for m in (2, 3, 4):
        cd = f"CD m={m}"
        fwd = get(cd, "fwd+ladj")
        lines.append(
            f"  {stat:>6} {cd}: ladj {get(dense, 'ladj') / get(cd, 'ladj'):7.1f}x, inverse "
            f"{get(dense, 'inv+ladj') / get(cd, 'inv+ladj'):6.1f}x faster than {dense}; fwd+ladj "
            f"{fwd / floor:4.2f}x the FFT floor ({fwd / ((m - 1) * floor):4.2f}x per circulant); "
            f"vs Glow 1x1: fwd {get('Glow 1x1', 'fwd+ladj') / fwd:6.2f}x, "
            f"inv {get('Glow 1x1', 'inv+ladj') / get(cd, 'inv+ladj'):6.2f}x faster"
        )
    return lines


def report(title: str, r: dict, names: list[str]) -> None:
    print(f"\n{title}, {r['rounds']} interleaved rounds; median (min) in ms")
    print(f"  {'contender':<14}" + "".join(f"{op:>22}" for op in OPS))
    for name in names:
        cells = [
            f"{'-':>22}" if (name, op) not in r else f"{1e3 * r[(name, op)]:12.4f} ({1e3 * r[('min', name, op)]:7.4f})"
            for op in OPS
        ]
        print(f"  {name:<14}" + "".join(cells))
    for stat in ("median", "min"):
        print("\n".join(_ratios(r, stat)))


def targets(r: dict) -> None:
    """The issue's targets at n = 1024, from the medians and from the minima."""
    print("\ntargets at n = 1024:")
    for stat in ("median", "min"):
        get = (lambda name, op: r[(name, op)]) if stat == "median" else (lambda name, op: r[("min", name, op)])
        floor = get("fft floor", "fwd+ladj")
        ladj = get("dense", "ladj") / get("CD m=3", "ladj")
        inv = get("dense", "inv+ladj") / get("CD m=3", "inv+ladj")
        fwd2 = get("CD m=2", "fwd+ladj") / floor
        fwd3 = get("CD m=3", "fwd+ladj") / (2 * floor)
        print(
            f"  {stat:>6}: log-det (m=3) {ladj:.0f}x vs dense slogdet "
            f"[>= 100x: {'met' if ladj >= 100 else 'NOT met'}]; "
            f"inverse (m=3) {inv:.1f}x vs dense solve [>= 20x: {'met' if inv >= 20 else 'NOT met'}]; "
            f"fwd+ladj m=2 {fwd2:.2f}x the floor, m=3 {fwd3:.2f}x per circulant "
            f"[<= 1.5x: {'met' if max(fwd2, fwd3) <= 1.5 else 'NOT met'}]"
        )


def main(argv: list[str] | None = None) -> dict[int, dict]:
    parser = _harness.parser(__doc__, seed=None)
    sizes = [16, 64, 256, 1024, 4096]
    parser.add_argument("--sizes", type=int, nargs="*", default=sizes, help="vector sizes (none: skip them)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of measurement per size (>= 3 rounds)")
    parser.add_argument("--max-rounds", type=int, default=200)
    parser.add_argument("--images", action="store_true", help="also time the channel form on images")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 96, 512])
    parser.add_argument("--image-shape", type=int, nargs=3, default=[16, 32, 32], metavar=("B", "H", "W"))
    args = _harness.setup(parser.parse_args(argv))
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {args.batch}, float32, no grad")
    results: dict[int, dict] = {}
    with torch.no_grad():
        for n in args.sizes:
            x = torch.randn(args.batch, n)
            table = contenders(n, x)
            results[n] = measure(table, args.budget, args.max_rounds)
            report(f"n = {n}", results[n], list(table))
        if args.images:
            b, h, w = args.image_shape
            for c in args.channels:
                x = torch.randn(b, c, h, w)
                table = contenders(c, x, image=True)
                results[-c] = measure(table, args.budget, args.max_rounds)
                report(f"images ({b}, {c}, {h}, {w}): channel form", results[-c], list(table))

    if 1024 in results:
        targets(results[1024])
    return results


if __name__ == "__main__":
    main()
