"""Sphinx configuration: Markdown pages (MyST), API reference from the docstrings (autodoc + napoleon).

Build offline with ``pip install ".[docs]"`` and ``sphinx-build -b html docs docs/_build/html``.
The API page lists every public module of the package, found at build time, so new families appear
without editing it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "flows"
author = "flows developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["sbi"]  # flows.interop.sbi documents without the optional dependency
html_theme = "alabaster"
suppress_warnings = ["myst.xref_missing"]


def public_modules() -> list[str]:
    """Every public module that defines things (packages only re-export, so they are skipped).

    Modules or package parts whose name starts with an underscore are private; ``flows.cli`` is
    documented as a command instead (``docs/guide/cli.md``).
    """
    import flows

    names = []
    for info in pkgutil.walk_packages(flows.__path__, prefix="flows."):
        private = any(p.startswith("_") for p in info.name.split("."))
        command = info.name == "flows.cli" or info.name.startswith("flows.cli.")
        if info.ispkg or private or command:
            continue
        names.append(info.name)
    return sorted(names)


def _api_page() -> str:
    """``docs/api.md`` as written (the layout), then every public module's docstrings."""
    lines = [(Path(__file__).parent / "api.md").read_text(), "", "## Modules", ""]
    lines += ["```{eval-rst}", ".. automodule:: flows", "```", ""]
    for name in public_modules():
        importlib.import_module(name)
        lines += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}", "   :members:", "```", ""]
    return "\n".join(lines)


def _fill_api(app, docname: str, source: list[str]) -> None:
    if docname == "api":
        source[0] = _api_page()


def setup(app) -> None:
    """Fill the API page at build time."""
    app.connect("source-read", _fill_api)
