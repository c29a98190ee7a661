"""The alanine-dipeptide example runs end to end on a tiny budget (numbers are not asserted beyond their ranges)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def _needs_openmm_and_data(name: str = "aldp_vacuum_1000K_md.npz") -> None:
    """Skip without OpenMM or without the shared data file ``name`` (CI has both)."""
    pytest.importorskip("openmm")
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not os.path.exists(os.path.join(directory, name)):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")


def test_boltzmann_alanine_example_smoke(tmp_path: Path, capsys) -> None:
    _needs_openmm_and_data()
    main = run_script(str(ROOT / "examples" / "boltzmann_alanine.py"), run_name="example")["main"]
    argv = ["--steps", "3", "--transforms", "2", "--hidden", "8", "--samples", "300", "--train-frames", "500"]
    result = main([*argv, "--out", str(tmp_path)])
    assert result["steps"] == 3 and result["n"] == 300
    assert 0 < result["ess"] <= 1 and math.isfinite(result["test_nll"])
    assert 0 <= result["p_b_raw"] <= 1 and result["kl_phi_raw"] >= 0
    assert (tmp_path / "ramachandran.png").stat().st_size > 1000
    assert "Kish ESS" in capsys.readouterr().out


def test_alanine_benchmark_smoke(tmp_path: Path) -> None:
    _needs_openmm_and_data()
    main = run_script(str(ROOT / "benchmarks" / "alanine.py"))["main"]
    argv = ["--max-steps", "2", "--transforms", "2", "--hidden", "8", "--samples", "300", "--train-frames", "300"]
    ml, tuned = main([*argv, "--ft-batch", "16", "--energy-cut", "1000", "--out", str(tmp_path)])
    assert ml["stage"] == "ml" and tuned["stage"] == "finetuned" and tuned["steps"] == 2
    assert 0 < tuned["ess"] <= 1 and math.isfinite(tuned["test_nll"]) and tuned["kl_rama_raw"] >= 0
    assert not tuned["delta_f_agrees"] or tuned["ess_abs_times_p_b"] >= 100
    assert (tmp_path / "ramachandran_1000K_finetuned.png").stat().st_size > 1000


def test_alanine_benchmark_stratified_smoke(tmp_path: Path) -> None:
    """--basin-b-seconds: a second flow for basin B (reflected frames, then reverse KL), the mixture evaluated."""
    _needs_openmm_and_data("aldp_vacuum_300K_umbrella.npz")
    main = run_script(str(ROOT / "benchmarks" / "alanine.py"))["main"]
    argv = ["--temperature", "300", "--max-steps", "2", "--transforms", "2", "--hidden", "8", "--samples", "300"]
    argv += ["--train-frames", "300", "--ft-batch", "16", "--linear-torsions", "0", "--basin-b-seconds", "2"]
    _, tuned, mixed = main([*argv, "--basin-b-weight", "0.25", "--out", str(tmp_path)])
    assert mixed["stage"] == "stratified" and mixed["basin_b_weight"] == 0.25 and mixed["b_ft_steps"] == 2
    assert 0 < mixed["ess"] <= 1 and math.isfinite(mixed["test_nll"]) and 0 <= mixed["b_flow_in_b"] <= 1
    assert 0 <= mixed["effective_samples_in_b"] <= mixed["samples_in_b"] <= 300
    assert (tmp_path / "ramachandran_300K_stratified.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        main([*argv, "--basin-b-weight", "1.0"])
    # --load-a: that run's A flow, not retrained (the same test NLL); the B flow trains under the restraint
    loaded, again = main([*argv, "--load-a", str(tmp_path / "flow_300K_finetuned.pt"), "--basin-b-restraint", "50"])
    assert [loaded["stage"], again["stage"]] == ["finetuned", "stratified"] and "steps" not in loaded
    assert loaded["test_nll"] == pytest.approx(tuned["test_nll"], abs=1e-9) and again["b_ft_steps"] == 2
    for bad in (["--basin-b-restraint", "-1"], ["--load-a", "x.pt", "--basin-b-seconds", "0"]):
        with pytest.raises(SystemExit):
            main([*argv, *bad])


def test_alanine_restraint_is_flat_in_basin_b_and_harmonic_outside() -> None:
    """RestrainedToB adds k d(phi)^2, d the angular distance from phi to B = [0, 2.2]: 0 inside."""
    _needs_openmm_and_data()
    module = run_script(str(ROOT / "benchmarks" / "alanine.py"))
    target = module["AlanineDipeptide"](temperature=300.0)
    x = target.reference_samples("test", dtype=torch.float64)[:50]
    phi = target.phi_psi(x)[:, 0]
    assert bool((phi < 0).all()) and bool((phi < -2.6).any())  # basin A, some frames nearer B's far edge
    distance = torch.minimum(-phi, phi + 2 * math.pi - 2.2)  # up to 0, or down through -pi round to 2.2
    restrained = module["RestrainedToB"](target, 7.0)
    torch.testing.assert_close(restrained.energy(x) - target.energy(x), 7.0 * distance**2)
    mirrored = -x  # the mirror image: every torsion changes sign; the frames with phi in (-2.2, 0) land in B
    mirrored, phi = mirrored[phi > -2.2], phi[phi > -2.2]
    assert len(phi) > 10
    torch.testing.assert_close(restrained.energy(mirrored), target.energy(mirrored))


def _alanine_benchmark():
    _needs_openmm_and_data()
    return run_script(str(ROOT / "benchmarks" / "alanine.py"))


def test_alanine_benchmark_ecnf_smoke(tmp_path: Path) -> None:
    main = _alanine_benchmark()["main"]
    argv = ["--model", "ecnf", "--max-steps", "3", "--ecnf-hidden", "8", "--ecnf-layers", "2", "--samples", "8"]
    argv += ["--ecnf-tol", "1e-3", "--ecnf-test-frames", "8", "--train-frames", "300", "--batch", "32"]
    (fm,) = main([*argv, "--out", str(tmp_path)])
    assert fm["stage"] == "fm" and fm["model"] == "ecnf" and fm["steps"] == 3 and fm["n"] == 8
    assert 0 < fm["ess"] <= 1 and 0 <= fm["d_fraction"] <= 1 and fm["test_frames"] == 8
    assert math.isfinite(fm["test_nll"]) and math.isfinite(fm["test_nll_mean_free"]) and fm["kl_rama_raw"] >= 0
    assert (tmp_path / "ramachandran_1000K_ecnf_fm.png").stat().st_size > 1000
    assert (tmp_path / "alanine_1000K_ecnf.json").exists()


def test_alanine_benchmark_ecnf_refuses_fine_tuning(capsys) -> None:
    main = _alanine_benchmark()["main"]
    with pytest.raises(SystemExit):
        main(["--model", "ecnf", "--ft-seconds", "5"])
    assert "--model ecnf has no energy fine-tuning stage" in capsys.readouterr().err


def test_labelled_ecnf_reflection_and_divergence() -> None:
    """log q(-x) = log q(x) (what the chirality fold's + log 2 rests on); AtomBias keeps the exact divergence."""
    torch = pytest.importorskip("torch")
    bench = run_script(str(ROOT / "benchmarks" / "alanine.py"))
    torch.manual_seed(0)
    flow = bench["labelled_ecnf"](22, 8, 3, 1e-8).double()
    field = flow.transform.field
    with torch.no_grad():  # move away from the near-identity start so the check has something to see
        for p in field.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = bench["centre"](torch.randn(2, 66, dtype=torch.float64))
    with torch.no_grad():
        log_q, log_q_mirror = flow.log_prob(x), flow.log_prob(-x)
    assert torch.allclose(log_q, log_q_mirror, atol=1e-6, rtol=0)
    swap = torch.cat([torch.arange(3, 6), torch.arange(0, 3), torch.arange(6, 66)])  # atoms 0 and 1 exchanged
    t = torch.tensor(0.3, dtype=torch.float64)
    assert (field(t, x[:, swap]) - field(t, x)[:, swap]).abs().max() > 1e-3  # the atoms are told apart
    f, div = field.divergence(t, x)
    jac = torch.autograd.functional.jacobian(lambda z: field(t, z), x)
    exact = torch.stack([torch.diagonal(jac[i, :, i, :]).sum() for i in range(len(x))])
    assert torch.allclose(div, exact, atol=1e-8, rtol=1e-8) and torch.allclose(f, field(t, x))


def test_fold_chirality_reflects_d_samples() -> None:
    torch = pytest.importorskip("torch")
    bench = run_script(str(ROOT / "benchmarks" / "alanine.py"))
    from flows.targets.alanine import _POSITIONS

    l_form = torch.tensor(_POSITIONS, dtype=torch.float64).flatten()
    x = torch.stack([l_form, -l_form, l_form])
    folded, log_q, d_fraction = bench["fold_chirality"](x, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(folded, l_form.expand(3, -1)) and abs(d_fraction - 1 / 3) < 1e-12
    assert torch.allclose(log_q, torch.full((3,), math.log(2), dtype=torch.float64))


def test_rigid_motion_nll_by_quadrature() -> None:
    """The ecnf test NLL's conversion: a mean-free Gaussian of 3 atoms, in internal coordinates, integrates to 1."""
    torch = pytest.importorskip("torch")
    bench = run_script(str(ROOT / "benchmarks" / "alanine.py"))
    from flows.bijections.internal_coordinates import InternalCoordinates
    from flows.particles import remove_mean

    ic = InternalCoordinates([(0,), (1, 0), (2, 1, 0)])
    m, top = 60, 7.0
    b = (torch.arange(m, dtype=torch.float64) + 0.5) * top / m
    a = (torch.arange(m, dtype=torch.float64) + 0.5) * math.pi / m
    q = torch.stack(torch.meshgrid(b, b, a, indexing="ij"), -1).reshape(-1, 3)
    x = ic.inverse(q)
    _, ladj = ic.forward_and_log_det(x)
    log_q_mean_free = -0.5 * remove_mean(x, 3, 3).square().sum(-1) - 3 * math.log(2 * math.pi)
    log_p_q = -bench["rigid_motion_nll"](-log_q_mean_free, 3) - ladj  # log p_Q = log p_X (rigid convention) - ladj
    assert abs(float(log_p_q.exp().sum()) * (top / m) ** 2 * (math.pi / m) - 1) < 1e-3


def test_openmm_bridge_benchmark_smoke(capsys) -> None:
    _needs_openmm_and_data("aldp_vacuum_300K_md.npz")
    main = run_script(str(ROOT / "benchmarks" / "openmm_bridge.py"), run_name="benchmark")["main"]
    result = main(["--frames", "20", "--repeats", "1"])  # it also checks the bridge's values against OpenMM's
    assert set(result) == {"openmm", "energy_and_grad", "autograd"} and all(v > 0 for v in result.values())
    assert "energy_and_grad" in capsys.readouterr().out
