"""The documentation's structure: every page reachable, every relative link valid, every module importable.

The full build (``pip install ".[docs]" && sphinx-build -W -b html docs docs/_build/html``) takes
longer than the rest of this suite and needs the docs extra, so CI checks what can break cheaply.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _conf():
    spec = importlib.util.spec_from_file_location("docs_conf", DOCS / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_page_covers_every_public_module() -> None:
    modules = _conf().public_modules()
    assert "flows.train.trainer" in modules and "flows.plot.density" in modules
    assert not any(part.startswith("_") for name in modules for part in name.split("."))
    for name in modules:
        importlib.import_module(name)  # autodoc imports each one


def test_every_guide_page_is_in_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    for page in sorted((DOCS / "guide").glob("*.md")):
        assert f"guide/{page.stem}\n" in index, f"{page.name} is not in the toctree of docs/index.md"
    assert ":glob:" in index  # top-level family pages (docs/<family>.md) are included by the glob


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_relative_links_resolve(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).resolve().is_file(), f"{page.name}: broken link to {target}"
