"""Pictures label their axes with a CSV file's column names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import flows
import flows.plot
from flows.cli import main
from flows.data import load_dataset
from flows.plot import plot_corner, plot_density_2d

TINY = ["--epochs", "1", "--transforms", "1", "--hidden", "4", "--quiet", "--patience", "0"]


def _csv(path: Path, header: str, columns: int) -> Path:
    rows = np.random.default_rng(0).normal(size=(120, columns))
    np.savetxt(path, rows, delimiter=",", header=header, comments="")
    return path


def test_a_csv_header_names_the_dataset_columns(tmp_path: Path) -> None:
    assert load_dataset(_csv(tmp_path / "a.csv", "height,weight,age", 3)).columns == ("height", "weight", "age")
    np.savetxt(tmp_path / "b.csv", np.zeros((20, 2)), delimiter=",")
    assert load_dataset(tmp_path / "b.csv").columns is None
    assert load_dataset("iris").columns is None


def test_plots_use_the_given_names() -> None:
    figure = plot_corner(torch.randn(50, 3), labels=["height", "weight", "age"], dims=[0, 2])
    assert {ax.get_xlabel() for ax in figure.axes} - {""} == {"height", "age"}
    with pytest.raises(ValueError, match="expected 2 labels"):
        plot_corner(torch.randn(50, 3), labels=["a"], dims=[0, 2])
    model = flows.Flow(flows.Affine(2), flows.StandardNormal(2))
    ax = plot_density_2d(model, torch.randn(20, 2), labels=["height", "weight"]).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("height", "weight")


@pytest.mark.parametrize(("columns", "function"), [(3, "plot_corner"), (2, "plot_density_2d")])
def test_fit_and_sample_pictures_carry_the_csv_column_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int, function: str
) -> None:
    names = ("height", "weight", "age")[:columns]
    seen: list[object] = []
    original = getattr(flows.plot, function)

    def spy(*args, **kwargs):
        seen.append(kwargs.get("labels"))
        return original(*args, **kwargs)

    monkeypatch.setattr(flows.plot, function, spy)
    data = _csv(tmp_path / "table.csv", ",".join(names), columns)
    out = tmp_path / "run"
    assert main(["fit", "--data", str(data), "--out", str(out), *TINY]) == 0
    assert seen and tuple(seen[-1]) == names
    if function == "plot_corner":
        assert main(["sample", str(out), "-n", "20"]) == 0
        assert len(seen) == 2 and tuple(seen[-1]) == names
