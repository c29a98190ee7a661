"""Adapters to other libraries, each imported on its own (``import flows.interop.pyro``).

``import flows`` imports none of them, and this package imports no other library.
"""
