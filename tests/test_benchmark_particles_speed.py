"""The speed section's stand-ins for the reference code compute the same field and trace as ``EGNN``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.particles import EGNN
from tests.scripts import run_script

F64 = torch.float64
BENCH = run_script(str(Path(__file__).resolve().parents[1] / "benchmarks" / "particles.py"), run_name="bench")


@pytest.fixture
def field() -> EGNN:
    torch.manual_seed(0)
    egnn = EGNN(5, 3, width=8, layers=3).to(F64)
    with torch.no_grad():
        for p in egnn.parameters():  # away from the near-identity initialisation
            p.add_(0.3 * torch.randn_like(p))
    return egnn


def test_edge_list_formulation_is_the_same_function(field: EGNN) -> None:
    z, t = torch.randn(4, 15, dtype=F64), torch.tensor(0.3, dtype=F64)
    edge = BENCH["EdgeListEGNN"](field)
    torch.testing.assert_close(edge(t, z), field(t, z), rtol=0, atol=1e-12)
    torch.testing.assert_close(edge(t, z[:2]), field(t, z[:2]), rtol=0, atol=1e-12)  # another batch size's edges


@pytest.mark.parametrize("columns", [False, True])
def test_brute_force_trace_equals_the_divergence(field: EGNN, columns: bool) -> None:
    z, t = torch.randn(4, 15, dtype=F64), torch.tensor(0.7, dtype=F64)
    f, div = BENCH["BruteForceField"](BENCH["EdgeListEGNN"](field), columns=columns).divergence(t, z)
    f0, div0 = field.divergence(t, z)
    torch.testing.assert_close(f, f0, rtol=0, atol=1e-12)
    torch.testing.assert_close(div, div0, rtol=0, atol=1e-10)
    assert not div.requires_grad and div.abs().min() > 1e-3  # a real trace, detached like the reference's
