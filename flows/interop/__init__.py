"""Adapters to other libraries' interfaces (sbi, Pyro), each imported on demand.

``import flows`` imports none of them: ``import flows.interop.sbi`` needs the optional ``sbi``
package (``pip install "flows[sbi]"``).
"""
