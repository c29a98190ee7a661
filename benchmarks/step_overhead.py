"""Training-step time of RealNVP against the bare-conditioner floor and peer libraries.

One training step = log_prob on a batch + backward + Adam. The **floor** is the bare conditioner
networks doing the same matmuls (8 MLPs 32 → 256 → 256 → 64 on (512, 32) inputs, summed output,
backward, Adam): everything a coupling flow adds on top of it is overhead. A second reference line,
``floor + input grads``, also computes each network's input gradient, a matmul per coupling that any
flow must do (a conditioner's input depends on the layers below) and the first floor skips. Peers: zuko `RealNVP`,
nflows `SimpleRealNVP`, normflows `MaskedAffineFlow` stacks of equal width (skipped with a note
when a peer is not installed: ``pip install ".[bench]"``).

All contenders are timed interleaved in one run, with one thread; the ratio of medians is the
headline, the ratio of best rounds is printed beside it (less sensitive to other load).

With ``--compile`` the floors, our RealNVP and zuko's also run under ``torch.compile`` (inductor,
what ``Trainer(compile=True)`` uses; the optimizer step stays eager for all), and a second table
compares the compiled contenders with the compiled floor: like against like.

    python benchmarks/step_overhead.py                  # D=64, batch 512, 8 couplings, hidden 2x256
    python benchmarks/step_overhead.py --repeats 5      # quicker
    python benchmarks/step_overhead.py --compile        # also under torch.compile (about a minute more)
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import _harness
import torch
from torch import nn

import flows


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def make_step(loss_fn: Callable[[torch.Tensor], torch.Tensor], params, lr: float = 1e-4) -> Callable:
    optimizer = torch.optim.Adam(params, lr=lr)

    def step(x: torch.Tensor) -> None:
        loss = loss_fn(x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


COMPILED = " (compiled)"


def contenders(features: int, transforms: int, hidden: int, compile: bool = False) -> dict[str, tuple[Callable, int]]:
    out: dict[str, tuple[Callable, int]] = {}
    half = features // 2

    floor = nn.ModuleList(
        nn.Sequential(
            nn.Linear(half, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2 * half)
        )
        for _ in range(transforms)
    )

    def floor_loss(x: torch.Tensor) -> torch.Tensor:
        h = x[:, :half]
        return sum(net(h).sum() for net in floor)

    out["floor (bare conditioners)"] = (make_step(floor_loss, floor.parameters()), _count(floor))

    # The same networks, but with the gradient with respect to each network's input computed too: in a
    # flow every conditioner's input depends on the layers below it, so backward must run these
    # matmuls (7 of 8 couplings here; the first one's input is the data). Printed as a second
    # reference line, so both the floor and this stricter one are visible side by side.
    floor_in = copy.deepcopy(floor)

    def floor_in_loss(x: torch.Tensor) -> torch.Tensor:
        h = x[:, :half].detach().requires_grad_()
        return sum(net(h).sum() for net in floor_in)

    out["floor + input grads"] = (make_step(floor_in_loss, floor_in.parameters()), _count(floor_in))

    ours = flows.RealNVP(features, transforms=transforms, hidden=(hidden, hidden))
    out["flows RealNVP"] = (make_step(lambda x: -ours.log_prob(x).mean(), ours.parameters()), _count(ours))

    if compile:  # fresh copies, so that eager and compiled contenders do not share optimizer state
        floor_c, floor_in_c, ours_c = copy.deepcopy(floor), copy.deepcopy(floor_in), copy.deepcopy(ours)
        out["floor" + COMPILED] = (
            make_step(torch.compile(lambda x: sum(net(x[:, :half]).sum() for net in floor_c)), floor_c.parameters()),
            _count(floor_c),
        )

        def floor_in_c_loss(x: torch.Tensor) -> torch.Tensor:
            h = x[:, :half].detach().requires_grad_()
            return sum(net(h).sum() for net in floor_in_c)

        out["floor + input grads" + COMPILED] = (
            make_step(torch.compile(floor_in_c_loss), floor_in_c.parameters()),
            _count(floor_in_c),
        )
        out["flows RealNVP" + COMPILED] = (
            make_step(torch.compile(lambda x: -ours_c.log_prob(x).mean()), ours_c.parameters()),
            _count(ours_c),
        )

    try:
        import zuko

        zk = zuko.flows.RealNVP(features, transforms=transforms, hidden_features=(hidden, hidden))
        out["zuko RealNVP"] = (make_step(lambda x: -zk().log_prob(x).mean(), zk.parameters()), _count(zk))
        if compile:
            zk_c = copy.deepcopy(zk)
            out["zuko RealNVP" + COMPILED] = (
                make_step(torch.compile(lambda x: -zk_c().log_prob(x).mean()), zk_c.parameters()),
                _count(zk_c),
            )
    except ImportError:
        print("zuko not installed: skipped")

    try:
        from nflows.flows import SimpleRealNVP

        nf = SimpleRealNVP(features, hidden_features=hidden, num_layers=transforms, num_blocks_per_layer=1)
        out["nflows SimpleRealNVP"] = (make_step(lambda x: -nf.log_prob(x).mean(), nf.parameters()), _count(nf))
    except ImportError:
        print("nflows not installed: skipped")

    try:
        import normflows as nfl

        layers = []
        for i in range(transforms):
            mask = (torch.arange(features) % 2 == i % 2).float()
            s = nfl.nets.MLP([features, hidden, hidden, features], init_zeros=True)
            t = nfl.nets.MLP([features, hidden, hidden, features], init_zeros=True)
            layers.append(nfl.flows.MaskedAffineFlow(mask, t, s))
        nm = nfl.NormalizingFlow(nfl.distributions.DiagGaussian(features, trainable=False), layers)
        out["normflows MaskedAffineFlow"] = (make_step(lambda x: nm.forward_kld(x), nm.parameters()), _count(nm))
    except ImportError:
        print("normflows not installed: skipped")
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = _harness.parser(__doc__, seed=None)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=5, help="steps per contender per round")
    parser.add_argument("--compile", action="store_true", help="also time contenders under torch.compile")
    args = _harness.setup(parser.parse_args(argv))
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.features)
    runs = contenders(args.features, args.transforms, args.hidden, args.compile)
    for name, (step, _) in runs.items():  # warm-up (and compilation)
        began = time.perf_counter()
        for _ in range(3):
            step(x)
        if name.endswith(COMPILED):
            print(f"{name}: compiled and warmed up in {time.perf_counter() - began:.1f} s")
    steps = {name: (lambda step=step: step(x)) for name, (step, _) in runs.items()}
    rounds = _harness.interleaved_times(steps, rounds=args.repeats, inner=args.steps, warmup=0)
    times = {name: [1e3 * wall for wall, _ in pairs] for name, pairs in rounds.items()}  # ms per step
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    floor = medians["floor (bare conditioners)"]
    floor_best = best["floor (bare conditioners)"]
    print(
        f"D={args.features}, batch {args.batch}, {args.transforms} couplings, hidden 2x{args.hidden}, "
        f"{args.threads} thread(s), median of {args.repeats} rounds x {args.steps} steps"
    )
    print(f"{'contender':<30} {'ms/step':>9} {'x floor':>8} {'best x floor':>13} {'params':>10}")
    for name, ms in medians.items():
        print(f"{name:<30} {ms:9.2f} {ms / floor:8.3f} {best[name] / floor_best:13.3f} {runs[name][1]:10,d}")
    ratios = {name: ms / floor for name, ms in medians.items()}
    if args.compile:
        floor_c, floor_c_best = medians["floor" + COMPILED], best["floor" + COMPILED]
        print(f"\nunder torch.compile, against the compiled floor ({floor_c:.2f} ms/step)")
        print(f"{'contender':<30} {'ms/step':>9} {'x floor':>8} {'best x floor':>13}")
        for name, ms in medians.items():
            if name.endswith(COMPILED):
                label = name[: -len(COMPILED)]
                print(f"{label:<30} {ms:9.2f} {ms / floor_c:8.3f} {best[name] / floor_c_best:13.3f}")
                ratios[name + " vs compiled floor"] = ms / floor_c
    return ratios


if __name__ == "__main__":
    main()
