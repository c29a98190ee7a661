"""One word, one meaning: every public signature against the glossary in ``docs/guide/concepts.md``.

The glossary's vocabulary table lists each shared argument name with the type its annotation must
name (or ``—`` for a word that is never a parameter). This test reads the table, walks every
public class and function of every public package, and fails on a parameter whose annotation does
not name that type, on a retired word, and on a glossary entry no signature uses (a stale entry).
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    "flows",
    "flows.architectures",
    "flows.bijections",
    "flows.classify",
    "flows.data",
    "flows.distributions",
    "flows.mcmc",
    "flows.metrics",
    "flows.nn",
    "flows.particles",
    "flows.plot",
    "flows.targets",
    "flows.train",
]


def _glossary() -> dict[str, tuple[str, ...]]:
    """``name -> allowed type tokens`` (empty for a retired word) from the table between the markers."""
    text = (ROOT / "docs" / "guide" / "concepts.md").read_text()
    table = text.split("<!-- vocabulary -->")[1].split("<!-- /vocabulary -->")[0]
    entries = {}
    for line in table.strip().splitlines()[2:]:
        name, types, _ = (cell.strip() for cell in line.strip("|").split("|", 2))
        entries[name.strip("`")] = tuple(t.strip().strip("`") for t in types.split(",") if t.strip() != "—")
    return entries


def _signatures() -> list[tuple[str, inspect.Parameter]]:
    """``(qualified name, parameter)`` for every named parameter of every public callable."""
    seen, out = set(), []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not callable(obj):
                continue
            seen.add(id(obj))
            function = obj.__init__ if inspect.isclass(obj) else obj
            try:
                signature = inspect.signature(function)
            except (TypeError, ValueError):
                continue
            for parameter in signature.parameters.values():
                if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name == "self":
                    continue
                out.append((f"{package}.{name}", parameter))
    return out


GLOSSARY = _glossary()
SIGNATURES = _signatures()


def test_the_glossary_table_is_read() -> None:
    assert {"features", "context", "hidden", "target", "levels", "scales", "noise_std", "probe"} <= set(GLOSSARY)
    assert GLOSSARY["noise"] == () and GLOSSARY["hidden"] == ("Sequence[int]",)
    assert len(SIGNATURES) > 500


@pytest.mark.parametrize("word", sorted(GLOSSARY))
def test_every_public_signature_uses_the_word_in_its_one_meaning(word: str) -> None:
    allowed = GLOSSARY[word]
    users = [(where, p) for where, p in SIGNATURES if p.name == word]
    if not allowed:
        assert not users, f"{word!r} is retired (docs/guide/concepts.md), still taken by {[w for w, _ in users]}"
        return
    assert users, f"the glossary lists {word!r} but no public signature takes it: drop the entry"
    wrong = []
    for where, parameter in users:
        annotation = str(parameter.annotation)
        if parameter.annotation is inspect.Parameter.empty or not any(
            re.search(rf"(?<![\w.]){re.escape(token)}(?![\w])", annotation) for token in allowed
        ):
            wrong.append(f"{where}({word}: {annotation})")
    assert not wrong, f"{word!r} means {allowed} in the glossary, but: {wrong}"


def test_the_check_catches_a_second_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function taking ``hidden: int`` (one width) is refused by the rule above."""

    def builder(hidden: int = 64) -> None: ...

    parameter = inspect.signature(builder).parameters["hidden"]
    annotation = str(parameter.annotation)
    assert not any(re.search(rf"(?<![\w.]){re.escape(t)}(?![\w])", annotation) for t in GLOSSARY["hidden"])
