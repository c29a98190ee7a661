"""Named data sets, user files, splits and the resumable loader."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.data import Dataset, TensorLoader, load_array, load_csv, load_dataset, split_data

pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")


def test_embedded_sets_and_reproducible_splits() -> None:
    digits = load_dataset("digits")
    assert (len(digits.train), len(digits.val), len(digits.test)) == (1293, 144, 360)
    assert digits.levels == 17 and digits.image_shape == (8, 8) and digits.train.dtype == torch.uint8
    wine = load_dataset("wine", seed=3)
    again = load_dataset("wine", seed=3)
    assert torch.equal(wine.train, again.train) and wine.features == 13
    other = load_dataset("wine", seed=4)
    assert not torch.equal(wine.train, other.train)
    together = torch.cat([wine.train, wine.val, wine.test])
    assert len(together) == 178 and len(torch.unique(together, dim=0)) == 178  # a partition of the rows


def test_split_data_partitions_without_overlap() -> None:
    rest, a, b = split_data(torch.arange(100), (0.1, 0.25), seed=1)
    assert (len(rest), len(a), len(b)) == (65, 10, 25)
    assert sorted(torch.cat([rest, a, b]).tolist()) == list(range(100))
    with pytest.raises(ValueError, match=r"expected fractions in \[0, 1\) summing to less than 1"):
        split_data(torch.arange(10), (0.6, 0.5))


def test_user_files(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4.5\n5,6\n")
    torch.testing.assert_close(load_csv(tmp_path / "t.csv"), torch.tensor([[1, 2], [3, 4.5], [5, 6]]))
    (tmp_path / "bad.csv").write_text("1,2\n3,\n")
    with pytest.raises(ValueError, match="expected a numeric CSV table"):
        load_csv(tmp_path / "bad.csv")
    (tmp_path / "nan.csv").write_text("1,2\nnan,3\n")
    with pytest.raises(
        ValueError,
        match=r"nan.csv: expected finite values, got 1 NaN/Inf/missing value\(s\), the first at line 2, column 1",
    ):
        load_csv(tmp_path / "nan.csv")

    np.savez(tmp_path / "splits.npz", train=np.ones((40, 3)), test=np.zeros((10, 3)))
    data = load_dataset(tmp_path / "splits.npz")
    assert (len(data.train), len(data.val), len(data.test)) == (36, 4, 10)
    np.savez(tmp_path / "two.npz", a=np.ones((4, 2)), b=np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"holds several arrays \['a', 'b'\]; choose one with key="):
        load_array(tmp_path / "two.npz")
    assert load_array(tmp_path / "two.npz", key="b").shape == (4, 2)

    images = np.random.default_rng(0).integers(0, 4, size=(50, 3, 5))
    np.save(tmp_path / "images.npy", images)
    data = load_dataset(tmp_path / "images.npy", levels=4)
    assert data.image_shape == (3, 5) and data.train.shape[1:] == (15,) and data.train.dtype == torch.int64
    with pytest.raises(ValueError, match=r"expected integers in 0\.\.2 with levels=3"):
        load_dataset(tmp_path / "images.npy", levels=3)
    with pytest.raises(FileNotFoundError, match=r"no such data file: 'nowhere\.csv'"):
        load_dataset("nowhere.csv")
    with pytest.raises(ValueError, match=r"unknown data set 'nowhere'"):
        load_dataset("nowhere")
    with pytest.raises(ValueError, match=r"expected a \.csv, \.npy or \.npz file"):
        (tmp_path / "x.txt").write_text("1")
        load_array(tmp_path / "x.txt")


def test_miniboone_from_the_data_directory() -> None:
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not (Path(directory) / "miniboone_maf_valtest.npz").is_file():
        pytest.skip("FLOWS_DATA_DIR with miniboone_maf_valtest.npz is not available")
    data = load_dataset("miniboone")
    assert isinstance(data, Dataset) and data.features == 43
    assert len(data.train) + len(data.val) == 3284 and len(data.test) == 3648
    assert "not comparable to published numbers" in data.describe()


def test_loader_resumes_mid_epoch_and_shards_cover_each_batch() -> None:
    x = torch.arange(23.0)
    full = TensorLoader(x, batch_size=4, seed=7)
    epoch0 = [b[0] for b in full]
    epoch1 = [b[0] for b in full]
    assert not torch.equal(torch.cat(epoch0), torch.cat(epoch1))  # a new permutation each epoch
    assert sorted(torch.cat(epoch0).tolist()) == x.tolist()

    resumed = TensorLoader(x, batch_size=4, seed=7)
    resumed.load_state_dict({"epoch": 1, "position": 3, "seed": 7})
    rest = [b[0] for b in resumed]
    assert all(torch.equal(a, b) for a, b in zip(rest, epoch1[3:], strict=True))

    shards = [TensorLoader(x, batch_size=4, seed=7, rank=r, world_size=2) for r in range(2)]
    for (a,), (b,), whole in zip(*shards, epoch0, strict=True):
        assert len(a) == len(b) and sorted(torch.cat([a, b]).tolist()) == sorted(whole.tolist()[: 2 * len(a)])
