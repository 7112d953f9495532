"""Cold-start figures per Lambda function: handler import time and deployed size.

Run after a SAM build (`.venv/bin/python deploy/sam.py build`), or let this script build:

    .venv/bin/python bench/cold_start.py

For every function of `template.yaml` it imports the handler module in a fresh interpreter
(as Lambda's init phase does: the layer on the path, the function's code as the working
directory), repeated to take the median, and measures the built function and the layer.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / ".aws-sam" / "build"
RUNS = 7
PROCESS_IMPORT_BUDGET_S = 1.0

IMPORT_SNIPPET = """
import importlib, sys, time
start = time.perf_counter()
module = importlib.import_module(sys.argv[1])
getattr(module, sys.argv[2])
print(time.perf_counter() - start)
"""


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def import_seconds(function_dir: Path, layer_dir: Path, handler: str) -> float:
    module, _, attribute = handler.rpartition(".")
    env = {"PYTHONPATH": f"{function_dir}:{layer_dir / 'python'}", "PATH": "/usr/bin:/bin"}
    samples = []
    for _ in range(RUNS):
        result = subprocess.run(
            [sys.executable, "-S", "-c", IMPORT_SNIPPET, module, attribute],
            cwd=function_dir,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(float(result.stdout.strip()))
    return statistics.median(samples)


def built_functions() -> dict[str, str]:
    """Function logical id -> handler, for the functions that have a Python handler."""
    template = json.loads(
        subprocess.run(
            [sys.executable, str(ROOT / "deploy" / "sam.py"), "functions"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return {name: spec["handler"] for name, spec in template.items()}


def main() -> None:
    if not BUILD.exists():
        subprocess.run([sys.executable, str(ROOT / "deploy" / "sam.py"), "build"], check=True)
    layer = BUILD / "SharedLayer"
    rows = []
    for name, handler in sorted(built_functions().items()):
        function_dir = BUILD / name
        if not function_dir.exists():
            continue
        entry = handler if handler.endswith(".handler") else "app.app"
        seconds = import_seconds(function_dir, layer, entry)
        rows.append(
            {
                "function": name,
                "handler": entry,
                "import_s_median": round(seconds, 4),
                "function_bytes": size_of(function_dir),
                "layer_bytes": size_of(layer),
            }
        )
    print(f"{'function':<24}{'import (median)':>18}{'function':>12}{'+ layer':>12}")
    for row in rows:
        print(
            f"{row['function']:<24}{row['import_s_median'] * 1000:>15.0f} ms"
            f"{row['function_bytes'] / 1024:>9.0f} KB"
            f"{(row['function_bytes'] + row['layer_bytes']) / 2**20:>9.1f} MB"
        )
    out = ROOT / "bench" / "results" / "cold_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"measured_at": time.time(), "rows": rows}, indent=2) + "\n")
    process = [r for r in rows if r["function"].startswith("Process")]
    if any(r["import_s_median"] > PROCESS_IMPORT_BUDGET_S for r in process):
        print(f"the process function imports in more than {PROCESS_IMPORT_BUDGET_S} s")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
