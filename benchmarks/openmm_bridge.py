"""Energy evaluations per second through the OpenMM bridge against OpenMM alone (issue 29: overhead ≤ 1.2×).

On ``--frames`` vacuum alanine-dipeptide MD frames, one thread, the same OpenMM ``Context`` and
platform, three contenders timed in turn (interleaved, each first in turn, ``--repeats`` rounds, medians):

* ``openmm``: the bare loop a user would write, ``setPositions(ndarray)`` then
  ``getState(getEnergy=True, getForces=True)`` and both read as NumPy values, per configuration;
* ``energy_and_grad``: :meth:`flows.targets.OpenMMTarget.energy_and_grad` on the whole batch
  (float64 tensors in and out, NaN and unit checks, u = E/RT and ∇u = −F/RT);
* ``autograd``: ``energy(x)`` with ``requires_grad`` and ``backward()`` (the bridge's
  ``torch.autograd.Function``, what reverse-KL training runs).

    python benchmarks/openmm_bridge.py --frames 1000 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from flows.targets import AlanineDipeptide


def bare_openmm(context, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Energies (kJ/mol) and forces of ``xs`` ``(B, n, 3)`` by OpenMM's own calls."""
    energy, force = np.empty(len(xs)), np.empty(xs.shape)
    for i, positions in enumerate(xs):
        context.setPositions(positions)
        state = context.getState(getEnergy=True, getForces=True)
        energy[i] = state.getPotentialEnergy()._value
        force[i] = state.getForces(asNumpy=True)._value
    return energy, force


def autograd(target: AlanineDipeptide, x: torch.Tensor) -> torch.Tensor:
    """``u`` by the bridge's autograd function and its gradient by ``backward``."""
    y = x.detach().requires_grad_(True)
    target.energy(y).sum().backward()
    return y.grad


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per configuration of each contender, interleaved over ``args.repeats`` rounds."""
    torch.set_num_threads(1)
    target = AlanineDipeptide(temperature=300.0, platform=args.platform)
    x = target.reference_samples("test", args.data_dir, dtype=torch.float64)[: args.frames]
    xs = x.numpy().reshape(len(x), -1, 3)
    context = target._get_context()  # the bridge's own Context, so both pay for the same OpenMM work
    energy, _ = bare_openmm(context, xs)
    u, grad = target.energy_and_grad(x)
    assert np.allclose(energy / target.kT, u.numpy(), rtol=1e-10, atol=1e-8), "the bridge and OpenMM disagree"
    assert torch.allclose(autograd(target, x), grad, rtol=1e-10, atol=1e-8), "autograd and energy_and_grad disagree"
    contenders = {
        "openmm": lambda: bare_openmm(context, xs),
        "energy_and_grad": lambda: target.energy_and_grad(x),
        "autograd": lambda: autograd(target, x),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.repeats):
        for name in names[r % 3 :] + names[: r % 3]:  # each contender goes first in turn
            start = time.perf_counter()
            contenders[name]()
            times[name].append((time.perf_counter() - start) / len(x))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--platform", default="Reference", choices=("Reference", "CPU"))
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    result = measure(args)
    base = result["openmm"]
    print(f"{args.frames} vacuum ALDP frames, {args.platform} platform, one thread, medians of {args.repeats}")
    for name, seconds in result.items():
        print(f"  {name:16s} {1e6 * seconds:8.1f} µs per configuration  {seconds / base:5.2f}×")
    return result


if __name__ == "__main__":
    main()
