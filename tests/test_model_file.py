"""Self-describing model files: safetensors weights + JSON config from the builder's actual arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import flows
from flows import FFJORD, MAF, NSF, Flow, Glow, RealNVP, StandardNormal, load_model, save_model
from flows.model_file import ModelFileError


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


MODELS = {
    "nsf-standardized": lambda: NSF(
        3, transforms=2, hidden=(8,), bins=4, lu=True, standardize=torch.randn(30, 3) * 5 + 9
    ),
    "maf-randperm-context": lambda: MAF(3, 2, transforms=2, hidden=[8, 8], randperm=True, activation=torch.nn.Tanh),
    "realnvp-shared": lambda: RealNVP(4, transforms=3, hidden=(8,), share_conditioner=True),
    "ffjord": lambda: FFJORD(2, hidden=(8,), eval_trace="exact"),
    "glow": lambda: Glow((1, 4, 4), scales=1, steps=1, hidden=(4, 4), mixer="lu"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_rebuilds_the_same_model(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _perturb(MODELS[name]()).eval()
    path = save_model(model, tmp_path / "model")
    assert path == tmp_path / "model.safetensors" and (tmp_path / "model.json").is_file()
    loaded = load_model(path)
    assert type(loaded) is type(model)
    context = torch.randn(5, 2) if name.startswith("maf") else None
    x = torch.rand(5, 1, 4, 4) if name == "glow" else model.sample((5,), context)
    torch.testing.assert_close(loaded.log_prob(x, context), model.log_prob(x, context))
    # one call from the directory, the json or the stem
    assert type(load_model(tmp_path / "model.json")) is type(model)


def test_config_holds_the_actual_arguments(tmp_path: Path) -> None:
    model = MAF(3, 2, transforms=2, hidden=[8, 8], activation=torch.nn.Tanh)
    save_model(model, tmp_path)
    config = json.loads((tmp_path / "model.json").read_text())
    assert config["builder"] == "MAF"
    arguments = config["arguments"]
    assert arguments["features"] == 3 and arguments["context"] == 2 and arguments["transforms"] == 2
    assert arguments["hidden"] == [8, 8] and arguments["activation"] == {"torch.nn": "Tanh"}
    assert arguments["clamp"] == 3.0  # defaults too: the file does not depend on this version's defaults
    assert "standardize" not in arguments and config["preprocessing"] == []


def test_weights_open_with_safetensors_alone(tmp_path: Path) -> None:
    model = NSF(2, transforms=1, hidden=(8,), standardize=torch.randn(20, 2) + 100)
    path = save_model(model, tmp_path)
    tensors = load_file(str(path))
    torch.testing.assert_close(tensors["transform.transforms.0.loc"], model.transform[0].loc)
    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["flows_config"])
    assert config["builder"] == "NSF"
    # and the weights file alone is enough to rebuild the model
    (tmp_path / "model.json").unlink()
    x = torch.randn(4, 2) + 100
    torch.testing.assert_close(load_model(path).log_prob(x), model.eval().log_prob(x))


def test_no_pickle_in_the_weights(tmp_path: Path) -> None:
    path = save_model(RealNVP(2, transforms=1, hidden=(4,)), tmp_path)
    header_size = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + header_size])
    assert all(v["dtype"] in ("F32", "F64", "I64", "BOOL") for k, v in header.items() if k != "__metadata__")


def _saved(tmp_path: Path) -> tuple[Path, dict]:
    path = save_model(MAF(3, transforms=1, hidden=(8,)), tmp_path)
    return path, json.loads((tmp_path / "model.json").read_text())


def _resign(path: Path, config: dict, tensors: dict | None = None) -> None:
    """Rewrite the weights file and model.json with ``config``, its digest recomputed (as an editor would)."""
    import hashlib

    tensors = load_file(str(path)) if tensors is None else tensors
    text = json.dumps(config)
    metadata = {"flows_config": text, "flows_config_sha256": hashlib.sha256(text.encode()).hexdigest()}
    save_file(tensors, str(path), metadata=metadata)
    path.with_suffix(".json").write_text(text)


def _table(tensors: dict) -> dict:
    from flows.model_file import _NAMES, _digest

    return {k: {"dtype": _NAMES[v.dtype], "shape": list(v.shape), "sha256": _digest(v)} for k, v in tensors.items()}


def test_refuses_missing_extra_and_misshaped_tensors(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    tensors = load_file(str(path))
    name = next(iter(tensors))
    for change, message in (
        (lambda t: t.pop(name), "missing tensors"),
        (lambda t: t.__setitem__("extra.weight", torch.zeros(2)), r"extra tensors \['extra\.weight'\]"),
        (lambda t: t.__setitem__(name, torch.zeros(7, 7)), r"expected tensor .* of shape .* got \(7, 7\)"),
    ):
        broken = dict(tensors)
        change(broken)
        save_file(broken, str(path), metadata={"flows_config": "{}", "flows_config_sha256": ""})
        with pytest.raises(ModelFileError, match=r"SHA-256|differ"):  # the unsigned edit
            load_model(tmp_path)
        _resign(path, {**config, "tensors": _table(broken)}, broken)  # the re-signed edit
        with pytest.raises(ModelFileError, match=message):
            load_model(tmp_path)


def test_refuses_an_unknown_builder(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "builder": "os.system"})
    with pytest.raises(ModelFileError, match=r"expected a builder among .* got 'os\.system'"):
        load_model(tmp_path)


def test_refuses_other_versions(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "format_version": 1})
    with pytest.raises(ModelFileError, match="expected model file format version 2, got 1"):
        load_model(tmp_path)
    _resign(path, {**config, "flows_version": "9.0.0"})
    with pytest.raises(ModelFileError, match=r"expected a model file written by flows 0\.1\.x, got one written by"):
        load_model(tmp_path)


def test_refuses_wrong_arguments_and_non_torch_nn_names(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "arguments": {**config["arguments"], "activation": {"torch.nn": "functional"}}})
    with pytest.raises(ModelFileError, match=r"expected the name of a torch\.nn module class"):
        load_model(tmp_path)
    _resign(path, {**config, "arguments": {**config["arguments"], "bogus": 1}})
    with pytest.raises(ModelFileError, match="expected arguments that MAF accepts"):
        load_model(tmp_path)


def test_an_edited_model_json_is_refused_naming_the_keys(tmp_path: Path) -> None:
    model = NSF(2, transforms=1, hidden=(8,), bound=5.0)
    save_model(model, tmp_path)
    config = json.loads((tmp_path / "model.json").read_text())
    config["arguments"]["bound"] = 3.0
    config["arguments"]["activation"] = {"torch.nn": "Tanh"}
    (tmp_path / "model.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelFileError, match=r"model\.json' differs .* \['arguments\.activation\.torch\.nn', 'arguments\.bound'\]"
    ):
        load_model(tmp_path)
    (tmp_path / "model.json").unlink()  # the weights file alone is the file of record
    x = torch.randn(3, 2)
    torch.testing.assert_close(load_model(tmp_path).log_prob(x), model.eval().log_prob(x))


def test_an_edited_config_in_the_weights_fails_its_digest(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    metadata["flows_config"] = metadata["flows_config"].replace('"transforms": 1', '"transforms": 2')
    save_file(tensors, str(path), metadata=metadata)
    (tmp_path / "model.json").unlink()
    with pytest.raises(ModelFileError, match="failed its SHA-256 check"):
        load_model(path)


def test_one_flipped_bit_in_a_tensor_is_refused(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"tensor .* failed its SHA-256 check"):
        load_model(tmp_path)


def test_weights_of_another_configuration_are_refused(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    other = save_model(MAF(3, transforms=1, hidden=(16,)), tmp_path / "other")
    other_config = json.loads(other.with_suffix(".json").read_text())
    _resign(path, {**config, "tensors": other_config["tensors"]}, load_file(str(other)))
    with pytest.raises(ModelFileError, match=r"expected tensor .* of shape \(8, 3\), got \(16, 3\)"):
        load_model(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.bool, torch.float64])
def test_a_tensor_of_another_dtype_is_refused_not_converted(dtype: torch.dtype, tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    tensors = load_file(str(path))
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name] = tensors[name].to(dtype)
    config["tensors"] = _table(tensors)
    _resign(path, config, tensors)
    with pytest.raises(ModelFileError, match=rf"expected tensor '{name}' of dtype torch\.float32, got {dtype}"):
        load_model(tmp_path)


def test_a_float64_model_comes_back_float64(tmp_path: Path) -> None:
    model = _perturb(NSF(2, transforms=1, hidden=(8,))).double().eval()
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert {t.dtype for t in loaded.state_dict().values() if t.is_floating_point()} == {torch.float64}
    x = torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(loaded.log_prob(x), model.log_prob(x))


@pytest.mark.parametrize("edit", [{"transforms": 10**9}, {"hidden": [10**6, 10**6]}, {"hidden": [60, 60]}])
def test_sizes_in_a_config_are_bounded_before_building(edit: dict, tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "arguments": {**config["arguments"], **edit}})
    with pytest.raises(
        ModelFileError, match=r"expected a size of at most|builds a model larger than its weights|missing tensors"
    ):
        load_model(tmp_path)


def test_the_build_budget_stops_a_large_allocation(tmp_path: Path) -> None:
    from flows.model_file import _BuildBudget

    with pytest.raises(ModelFileError, match="builds a model larger than its weights"), _BuildBudget(10**6, 10**6, "f"):
        torch.empty(10**9)
    with pytest.raises(ModelFileError, match=r"got \d+ bytes in 11"), _BuildBudget(10**9, 10, "f"):
        for _ in range(20):
            torch.zeros(1)


@pytest.mark.parametrize("cut", ["empty", "short-length", "half", "last-byte", "padded", "huge-header"])
def test_truncated_and_oversized_files_are_clear_errors(cut: str, tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    data = {
        "empty": b"",
        "short-length": data[:5],
        "half": data[: len(data) // 2],
        "last-byte": data[:-1],
        "padded": data + b"\0" * 16,
        "huge-header": (2**62).to_bytes(8, "little") + data[8:],
    }[cut]
    path.write_bytes(data)
    with pytest.raises(ModelFileError, match=r"truncated|corrupt|padded"):
        load_model(tmp_path)


@pytest.mark.parametrize("where", ["no-such-device", "cuda:99", "meta", 3.5])
def test_a_bad_map_location_is_a_clear_error(where, tmp_path: Path) -> None:
    _saved(tmp_path)
    with pytest.raises(ModelFileError, match="expected map_location"):
        load_model(tmp_path, map_location=where)


def test_refuses_models_a_config_cannot_describe(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="expected a model made by one of the builders"):
        save_model(Flow(flows.Affine(2), StandardNormal(2)), tmp_path)
    with pytest.raises(ModelFileError, match="expected constructor arguments that are JSON values"):
        save_model(flows.FreeFormInjectiveFlow(2, latent_features=1, encoder=torch.nn.Linear(2, 1)), tmp_path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no model file at"):
        load_model(tmp_path / "nothing")


@pytest.mark.parametrize("marker", ["distributions-idiom", "load-model"])
def test_readme_examples_run(marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split(f"<!-- {marker} -->\n```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, f"README.md:{marker}", "exec"), namespace)
    if marker == "load-model":
        assert type(namespace["model"]) is NSF and (tmp_path / "models" / "nsf.json").is_file()
    else:
        assert namespace["log_p"].shape == (10, 4) and namespace["kl"].shape == (4,)
        assert namespace["samples"].shape == (5, 2) and bool(
            ((namespace["samples"] > 0) & (namespace["samples"] < 1)).all()
        )


def test_eval_and_check_read_the_verified_model_file(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")
    from flows.cli import main

    out = tmp_path / "run"
    fit = ["fit", "--data", "moons", "--epochs", "1", "--out", str(out), "--no-plots", "--quiet"]
    assert main([*fit, "--transforms", "1", "--hidden", "8", "--threads", "1"]) == 0
    assert load_model(out).log_prob(torch.zeros(1, 2)).isfinite().all()
    capsys.readouterr()
    assert main(["eval", str(out), "--json"]) == 0
    good = json.loads(capsys.readouterr().out)["log_likelihood"]
    config = json.loads((out / "model.json").read_text())
    config["arguments"]["clamp"] = 1.0  # another density, with the same tensors
    (out / "model.json").write_text(json.dumps(config))
    for command in ("eval", "check"):
        assert main([command, str(out)]) != 0
        assert "differs from the config stored in" in capsys.readouterr().err
    (out / "model.json").unlink()  # the weights file alone is the file of record
    assert main(["eval", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_likelihood"] == good
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-2] ^= 0x10
    (out / "model.safetensors").write_bytes(bytes(data))
    assert main(["check", str(out)]) != 0
    assert "failed its SHA-256 check" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argument", "value"), [("clamp", True), ("transforms", 1.0), ("hidden", [8.0]), ("residual", 1)]
)
def test_an_argument_of_another_kind_is_refused_against_the_annotation(argument, value, tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "arguments": {**config["arguments"], argument: value}})
    with pytest.raises(
        ModelFileError, match=rf"expected argument '{argument}' of the config .* got {re.escape(repr(value))}"
    ):
        load_model(tmp_path)


def test_loading_leaves_the_global_random_state_alone(tmp_path: Path) -> None:
    _saved(tmp_path)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    load_model(tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_a_bad_map_location_is_refused_for_a_checkpoint_too(tmp_path: Path) -> None:
    from flows.model_file import describe_model
    from flows.train import save_checkpoint

    model = RealNVP(2, transforms=1, hidden=[4])
    path = save_checkpoint(tmp_path / "run.ckpt", {"model": model.state_dict()}, config=describe_model(model))
    with pytest.raises(ModelFileError, match="expected map_location"):
        load_model(path, map_location="no-such-device")
    assert type(load_model(path, map_location=torch.device("cpu"))) is RealNVP


def test_a_refused_build_leaves_grad_mode_and_random_state_alone(tmp_path: Path) -> None:
    path, config = _saved(tmp_path)
    _resign(path, {**config, "arguments": {**config["arguments"], "transforms": 4000}})
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    with pytest.raises(ModelFileError, match="builds a model larger than its weights"):
        load_model(tmp_path)
    assert torch.is_grad_enabled() and torch.equal(torch.rand(3), expected)
