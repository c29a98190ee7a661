"""What ``import flows`` and ``flows --help`` cost on top of ``import torch``, and which heavy modules they load.

Each round starts a fresh interpreter that imports torch, then times (wall and CPU) the import of
flows, or the parsing of ``flows --help``, in the same process: the figure is the cost *on top of*
torch, which every flows program pays anyway. Rounds alternate between the commands; the medians
are printed. Trees to compare (e.g. another checkout) go in ``--trees``; the default is this one.

    python benchmarks/import_time.py                       # 7 rounds, this checkout
    python benchmarks/import_time.py --trees ../main .     # before / after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch._dynamo", "sympy", "scipy", "torchdiffeq", "matplotlib", "tqdm.auto", "sklearn", "tensorboard")

_PROBE = """
import json, sys, time
import torch
before = set(sys.modules)
wall, cpu = time.perf_counter(), time.process_time()
{code}
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
new = set(sys.modules) - before
print(json.dumps({{"wall": wall, "cpu": cpu, "modules": len(new), "heavy": sorted(h for h in {heavy!r} if h in new)}}))
"""
CODES = {
    "import flows": "import flows",
    "flows --help": (
        "import contextlib, io\nfrom flows.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main(['--help'])\n"
        "    except SystemExit:\n        pass"
    ),
}


def probe(tree: Path, code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    script = _PROBE.format(code=code, heavy=HEAVY)
    # cwd=tree: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT], help="checkouts to compare")
    parser.add_argument("--what", nargs="+", choices=list(CODES), default=list(CODES), help="commands to time")
    args = parser.parse_args(argv)
    args.trees = [t.resolve() for t in args.trees]
    runs: dict[tuple[str, str], list[dict]] = {(str(t), c): [] for t in args.trees for c in args.what}
    for _ in range(args.rounds):
        for tree in args.trees:
            for name in args.what:
                runs[str(tree), name].append(probe(tree, CODES[name]))
    results = {}
    print(f"{'tree':<28} {'command':<14} {'wall s':>7} {'CPU s':>7} {'modules':>8}  heavy modules loaded")
    for (tree, name), samples in runs.items():
        wall = statistics.median(s["wall"] for s in samples)
        cpu = statistics.median(s["cpu"] for s in samples)
        modules = samples[-1]["modules"]
        heavy = ", ".join(samples[-1]["heavy"]) or "-"
        results[tree, name] = {"wall": wall, "cpu": cpu, "modules": modules, "heavy": samples[-1]["heavy"]}
        print(f"{tree[-28:]:<28} {name:<14} {wall:7.2f} {cpu:7.2f} {modules:8d}  {heavy}")
    print(f"(medians of {args.rounds} rounds; on top of `import torch`, in the same process)")
    return results


if __name__ == "__main__":
    main()
