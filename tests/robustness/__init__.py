"""The robustness attack table of issue 17 (see ``table.py``) and its tests; ``benchmarks/reliability.py`` counts it."""
