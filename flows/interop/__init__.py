"""Adapters to other libraries (Pyro, sbi), each imported on its own (``import flows.interop.pyro``).

``import flows`` imports none of them, and this package imports no other library:
``import flows.interop.sbi`` needs the optional ``sbi`` package (``pip install "flows[sbi]"``),
``import flows.interop.pyro`` the optional ``pyro-ppl`` (``pip install "flows[pyro]"``).
"""
