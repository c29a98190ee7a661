"""Deprecated import path: this module moved to :mod:`flows.architectures.dependent` (``docs/architecture.md``)."""

from flows._deprecation import moved_module

moved_module(__name__)
