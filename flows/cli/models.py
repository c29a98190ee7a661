"""``flows models``: the model builders that ``flows fit --model`` accepts."""

from __future__ import annotations

import argparse
import sys

__all__ = ["models"]


def models(args: argparse.Namespace) -> int:
    """``flows models``: print the builders ``flows fit --model`` accepts, one a line; returns 0."""
    from flows.train.config import available_models

    for name in available_models():
        print(name)
    print("(use with: flows fit --model NAME; extra keyword options with --option KEY=VALUE)", file=sys.stderr)
    return 0
