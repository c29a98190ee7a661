"""Reference-data tools: MBAR on a 1-D harmonic toy with exact free energies; OpenMM MD and ``flows data``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from flows.cli.app import main
from flows.metrics import free_energy_profile

pymbar = pytest.importorskip("pymbar")


def _harmonic_windows(centres: torch.Tensor, k: float, n: int, gen: torch.Generator):
    """Exact samples of u0 = x²/2 biased by k/2 (x - c)² in each window, and every sample's bias in every window."""
    mean, std = k * centres / (1 + k), 1 / math.sqrt(1 + k)
    x = (mean[:, None] + std * torch.randn(len(centres), n, generator=gen, dtype=torch.float64)).flatten()
    window = torch.arange(len(centres)).repeat_interleave(n)
    bias = 0.5 * k * (x[None, :] - centres[:, None]).square()
    return x, window, bias


def test_mbar_recovers_exact_window_free_energies_and_the_unbiased_profile():
    from flows.mcmc.molecular_dynamics import mbar_log_weights

    gen = torch.Generator().manual_seed(0)
    centres, k = torch.linspace(-3, 3, 7, dtype=torch.float64), 4.0
    x, window, bias = _harmonic_windows(centres, k, 2000, gen)
    f, se, log_w = mbar_log_weights(bias, window)
    # Z_i / Z_0 = (1 + k)^(-1/2) exp(-k c² / (2 (1 + k))): f_i - f_0 = -log(Z_i / Z_0)
    exact = 0.5 * math.log(1 + k) + k * centres.square() / (2 * (1 + k))
    assert ((f - exact).abs() < 4 * se + 1e-3).all() and se.max() < 0.1
    assert abs(float(torch.logsumexp(log_w, 0))) < 1e-12
    mean_sq = float((log_w.exp() * x.square()).sum())  # the unbiased <x²> = 1
    assert abs(mean_sq - 1) < 0.05
    profile = free_energy_profile(x, log_w, bins=12, range=(-2.0, 2.0))
    expected = 0.5 * profile.centres.square() + 0.5 * math.log(2 * math.pi)  # -log N(x; 0, 1)
    assert ((profile.free_energy - expected).abs() < 4 * profile.stderr + 0.02).all()


def test_mbar_bad_input():
    from flows.mcmc.molecular_dynamics import mbar_log_weights

    with pytest.raises(ValueError, match=r"bias_kT \(windows, N\) and window \(N,\)"):
        mbar_log_weights(torch.zeros(2, 5), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"samples in each of the 3 windows, got \[3, 2, 0\]"):
        mbar_log_weights(torch.zeros(3, 5), torch.tensor([0, 0, 0, 1, 1]))


def test_torsion_bias_is_periodic():
    from flows.mcmc.molecular_dynamics import torsion_bias_energy

    b = torsion_bias_energy(torch.tensor([3.0, -3.0, 0.1]), torch.tensor([math.pi, 0.0]), 2.0)
    torch.testing.assert_close(b[0, :2], torch.full((2,), (math.pi - 3) ** 2, dtype=b.dtype))
    torch.testing.assert_close(b[1], torch.tensor([9.0, 9.0, 0.01]))


def test_langevin_frames_are_an_l_trajectory_with_target_energies():
    pytest.importorskip("openmm")
    from flows.mcmc.molecular_dynamics import langevin_frames
    from flows.targets import AlanineDipeptide

    target = AlanineDipeptide(temperature=300.0, platform="CPU")
    x, u = langevin_frames(target, target.positions0, 10, spacing=20, equilibration=50, seed=3)
    assert x.shape == (10, 66) and u.shape == (10,)
    torch.testing.assert_close(u, target.energy(x), rtol=0, atol=1e-9)
    assert (u < 0).all() and u.std() > 0  # minimised, thermal: ⟨u⟩ ≈ -18 kT at 300 K, never the 1000s of a clash
    pos = x.reshape(10, 22, 3)
    n, c, cb = (pos[:, a] - pos[:, 8] for a in (6, 14, 10))  # signed volume at CA stays positive (L)
    assert (torch.linalg.cross(n, c).mul(cb).sum(-1) > 0).all()
    with pytest.raises(ValueError, match="positive int frames"):
        langevin_frames(target, target.positions0, 0)
    with pytest.raises(ValueError, match="66 numbers"):
        langevin_frames(target, torch.zeros(65), 2)


def test_flows_data_md_and_umbrella_write_checksummed_files(tmp_path, capsys):
    pytest.importorskip("openmm")
    common = ["--data-dir", str(tmp_path), "--spacing-ps", "0.01", "--step-fs", "1"]
    assert main(["data", "md", "--out", "md.npz", "--frames", "20", "--equilibration-ps", "0.05", *common]) == 0
    with np.load(tmp_path / "md.npz") as f:
        assert f["train"].shape == (16, 66) and f["val"].shape == (2, 66) and f["test"].shape == (2, 66)
        assert f["train"].dtype == np.float32 and f["energy_kT_test"].dtype == np.float64
        meta = json.loads(str(f["meta"]))
    assert meta["settings"]["frames"] == 20 and "mean_energy_kT" in meta["measured"]
    from flows.data.files import sha256sum

    digest = (tmp_path / "md.npz.sha256").read_text().split()[0]
    assert digest == sha256sum(tmp_path / "md.npz") and digest in capsys.readouterr().out
    argv = ["data", "umbrella", "--out", "u.npz", "--windows", "4", "--frames-per-window", "6", "--bins", "8"]
    weak = ["--force-constant", "5", "--equilibration-ps", "0.02", "--boot", "2", "--block", "3"]  # windows overlap
    assert main([*argv, *weak, *common]) == 0
    with np.load(tmp_path / "u.npz") as f:
        assert f["positions"].shape == (24, 66) and f["F_phi_kT"].shape == (8,)
        assert abs(float(np.logaddexp.reduce(f["log_weights"]))) < 1e-9
        assert sorted(set(f["window"].tolist())) == [0, 1, 2, 3]
    # refusing to overwrite, and bad options, are one-line errors with status 2
    assert main(["data", "md", "--out", "md.npz", "--frames", "20", *common]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["data", "md", "--out", "x.txt", "--frames", "20", *common]) == 2
    assert main(["data", "md", "--out", "y.npz", "--frames", "20", "--split", "0.5", "0.5", "0.5", *common]) == 2
    assert "summing to 1" in capsys.readouterr().err
