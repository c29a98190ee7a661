"""The run specification of ``flows fit`` (issue 31): one flag table, and the parser, the ``--resume`` help, the
resume check and the objective check all read from it; ``--noise-std`` is one of its flags."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from flows.cli import _parser, main
from flows.cli.fit_flags import FIT_FLAGS, OBJECTIVES, FitFlag, check_objective_flags, resume_policy, run_settings
from flows.train.runs import REFUSED_POLICIES, RESUME_POLICIES, read_run_file, resume_changes

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")

TINY = ["--transforms", "1", "--hidden", "4", "--threads", "1", "--epochs", "1", "--quiet", "--no-plots"]
OBJECTIVE_FLAGS = [f for f in FIT_FLAGS if f.objective is not None]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _fit_parser() -> argparse.ArgumentParser:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices["fit"]


def _other_value(flag: FitFlag) -> str:
    """A value of ``flag`` on the command line that is valid and not its default."""
    choices = flag.keywords.get("choices")
    if choices is not None:
        return next(c for c in choices if c != flag.default)
    default = flag.default
    return str(default * 2 + 1)  # every numeric flag with a default accepts a larger value


def _parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["fit", *argv])


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    return lines[0]


# -- the parser and the help come from the table -----------------------------------------------------------------------
def test_the_fit_parser_has_exactly_the_flags_of_the_table_with_their_defaults_and_groups() -> None:
    parser = _fit_parser()
    actions = {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}
    assert list(actions) == [f.name for f in FIT_FLAGS]
    for flag in FIT_FLAGS:
        assert actions[flag.name].option_strings == [flag.option]
        assert actions[flag.name].default == flag.default, flag.name
        assert flag.resume in RESUME_POLICIES, flag.name
        assert flag.objective in (None, *OBJECTIVES), flag.name
    groups = {a.dest: g.title for g in parser._action_groups for a in g._group_actions}
    assert all(groups[f.name] == f.group for f in FIT_FLAGS)


def test_the_resume_help_lists_exactly_the_flags_resume_refuses_and_those_it_records() -> None:
    action = next(a for a in _fit_parser()._actions if a.dest == "resume")
    must_repeat, may_change = action.help.split("(a difference is refused and listed)")
    named = lambda text: set(re.findall(r"--[a-z][a-z-]*", text))  # noqa: E731
    refused = {f.option for f in FIT_FLAGS if f.resume in REFUSED_POLICIES}
    assert named(must_repeat) - {"--out"} == refused
    assert named(may_change) == {f.option for f in FIT_FLAGS if f.resume == "record"} == {"--epochs", "--time-budget"}
    # the flags the old help left out, although resume refused them
    assert {"--objective", "--sigma", "--coupling", "--velocity", "--reference-size", "--time-power"} <= refused


def test_the_cli_guide_lists_every_flag_that_resume_refuses() -> None:
    guide = (ROOT / "docs" / "guide" / "cli.md").read_text(encoding="utf-8")
    section = guide.split("### Resuming", 1)[1].split("###", 1)[0]
    refused_part = section.split("**refused**", 1)[1].split("To train with other settings", 1)[0]
    named = set(re.findall(r"`(--[a-z][a-z-]*)", refused_part))
    assert named == {f.option for f in FIT_FLAGS if f.resume in REFUSED_POLICIES}
    table = guide.split("## `flows fit`", 1)[1].split("###", 1)[0]
    assert {f.option for f in FIT_FLAGS} <= set(re.findall(r"`(--[a-z][a-z-]*)", table))


# -- the resume check reads the policy of each flag -------------------------------------------------------------------
@pytest.mark.parametrize("flag", [f for f in FIT_FLAGS if f.resume in ("refuse", "record")], ids=lambda f: f.option)
def test_resume_refuses_a_changed_training_setting_and_records_a_changed_stopping_rule(flag: FitFlag) -> None:
    before = run_settings(_parse())
    if flag.default is None:  # --time-budget: none by default
        now = run_settings(_parse(flag.option, "5"))
    else:
        now = run_settings(_parse(flag.option, _other_value(flag)))
    assert now[flag.name] != before[flag.name]
    if flag.resume == "refuse":
        with pytest.raises(ValueError, match=f"got {re.escape(flag.option)} .* \\(the run has "):
            resume_changes(before, now, resume_policy(), Path("run"))
    else:
        assert resume_changes(before, now, resume_policy(), Path("run")) == {
            flag.name: [before[flag.name], now[flag.name]]
        }
    assert resume_changes({}, now, resume_policy(), Path("run")) == {}  # a run that did not record it: not compared


def test_flags_that_only_change_how_a_run_executes_are_not_compared() -> None:
    settings = run_settings(_parse("--threads", "1", "--checkpoint-every", "5", "--quiet"))
    assert not {f.name for f in FIT_FLAGS if f.resume != "refuse" and f.resume != "record"} & set(settings)


# -- the objective check reads the objective of each flag -----------------------------------------------------------
@pytest.mark.parametrize("flag", OBJECTIVE_FLAGS, ids=lambda f: f.option)
def test_a_flag_of_one_objective_is_refused_with_another(tmp_path: Path, capsys, flag: FitFlag) -> None:
    value = _other_value(flag)
    needs = ["--" + flag.requires[0].replace("_", "-"), str(flag.requires[1])] if flag.requires else []
    own = _parse("--objective", flag.objective, flag.option, value, *needs)
    check_objective_flags(own)  # accepted with its own objective
    other = next(o for o in OBJECTIVES if o != flag.objective)
    argv = ["fit", "--data", "iris", *TINY, "--out", str(tmp_path / "run"), "--objective", other, flag.option, value]
    assert main(argv) == 2
    error = _one_error(capsys.readouterr().err)
    assert f"{flag.option} " in error and f"only with --objective {flag.objective}, got --objective {other}" in error
    assert f"expected {OBJECTIVES[flag.objective]} flags" in error
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.parametrize("flag", [f for f in FIT_FLAGS if f.requires is not None], ids=lambda f: f.option)
def test_a_flag_that_requires_another_value_is_refused_without_it(flag: FitFlag) -> None:
    needed, value = flag.requires
    other = next(c for c in flag_by_name(needed).keywords["choices"] if c != value)
    option = "--" + needed.replace("_", "-")
    args = _parse("--objective", flag.objective, flag.option, _other_value(flag), option, other)
    with pytest.raises(ValueError, match=f"expected it only with {option} {value}, got {option} {other}"):
        check_objective_flags(args)
    check_objective_flags(_parse("--objective", flag.objective, flag.option, _other_value(flag), option, str(value)))


def flag_by_name(name: str) -> FitFlag:
    return next(f for f in FIT_FLAGS if f.name == name)


# -- --noise-std ----------------------------------------------------------------------------------------------------
def test_noise_std_trains_with_noise_augmentation_and_is_recorded(tmp_path: Path, monkeypatch) -> None:
    from flows.train import trainer as trainer_module

    seen = []
    real_fit = trainer_module.Trainer.fit

    def spy(self, *args, **kwargs):
        seen.append(self.objective)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module.Trainer, "fit", spy)
    out = tmp_path / "noise"
    assert main(["fit", "--data", "moons", *TINY, "--noise-std", "0.25", "--out", str(out)]) == 0
    assert main(["fit", "--data", "moons", *TINY, "--out", str(tmp_path / "clean")]) == 0
    assert [type(o).__name__ for o in seen] == ["MaximumLikelihood"] * 2
    assert seen[0].noise_std == 0.25 and seen[1].noise_std is None
    assert read_run_file(out)["fit"]["noise_std"] == 0.25
    # the validation loss is that of noised data (the noised density is wider): not the clean run's
    noised, clean = (read_run_file(p)["untrained_val_loss"] for p in (out, tmp_path / "clean"))
    assert noised != clean


def test_noise_std_on_integer_data_is_refused_naming_the_flag_and_the_levels(tmp_path: Path, capsys) -> None:
    out = tmp_path / "digits"
    assert main(["fit", "--data", "digits", *TINY, "--noise-std", "0.1", "--out", str(out)]) == 2
    error = _one_error(capsys.readouterr().err)
    assert "--noise-std 0.1: expected continuous data, got integer data with 17 levels" in error
    assert "Logit" in error
    assert not (out / "run.json").exists()


def test_a_model_noise_std_on_integer_data_is_refused_before_training(tmp_path: Path, capsys) -> None:
    options = ["--model", "TarFlow", "--option", "patch=4", "--option", "noise_std=0.1"]
    out = tmp_path / "tarflow"
    assert main(["fit", "--data", "digits", *TINY, *options, "--out", str(out)]) == 2
    error = _one_error(capsys.readouterr().err)
    assert "--option noise_std=0.1: expected continuous data, got integer data with 17 levels" in error
    assert not (out / "run.json").exists()
    assert main(["fit", "--data", "digits", *TINY, *options, "--noise-std", "0.2", "--out", str(out)]) == 2
    assert "--noise-std 0.2: expected the noise_std the model records (0.1" in _one_error(capsys.readouterr().err)
