"""Cold-start figures per Lambda function: handler import, first response, deployed size.

    .venv/bin/python bench/cold_start.py           # builds with SAM first if needed

For every function of `template.yaml`, in a fresh interpreter with only the built layer and
the function's code on the path (as in Lambda), it measures

- **import**: importing the handler module (Lambda's init phase), wall clock and CPU time
  (CPU time is the steadier figure on a loaded machine);
- **first response**: building the application and answering `GET /health`, which a
  function does on its first invocation (stores are not contacted by `/health`'s build);

as medians over several fresh interpreters, and the size of the built function and layer as
deployed. As in Lambda, where ``/opt`` and the function's code are read-only, the probes write no
bytecode: a module imports from the bytecode the build ships, else from its source, every time.
The layer must stay within ``LAYER_BUDGET_BYTES`` unpacked.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

from tests.support.lambda_runtime import function_url_event  # noqa: E402

from agentscope_serverless.packaging import sam  # noqa: E402

BUILD = ROOT / ".aws-sam" / "build"
RUNS = 7
IMPORT_TARGET_S = 0.3
LAYER_BUDGET_BYTES = 35 * 2**20
HEALTH_EVENT = json.dumps(function_url_event("GET", "/health"))

PROBE = """
import json, sys, time
start = time.perf_counter()
cpu_start = time.process_time()
module = __import__(sys.argv[1])
imported = time.perf_counter()
import_cpu = time.process_time() - cpu_start
if sys.argv[2] == "factory":
    from starlette.testclient import TestClient
    with TestClient(module.create()) as client:
        status = client.get("/health").status_code
else:
    status = module.handler(json.loads(sys.argv[3]), None)["statusCode"]
done = time.perf_counter()
print(json.dumps({"import": imported - start, "import_cpu": import_cpu, "first": done - start,
                  "status": status}))
"""


def size_of(path: Path) -> int:
    """Bytes as deployed (the probes write nothing into the build)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def probe(function_dir: Path, layer: Path, kind: str) -> dict[str, float]:
    env = {
        "PYTHONPATH": f"{function_dir}:{layer / 'python'}",
        "PATH": "/usr/bin:/bin",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
        # Lambda cannot write __pycache__ beside read-only code: nor can the probes.
        "PYTHONDONTWRITEBYTECODE": "1",
        "AUTH_KEYS_BACKEND": "in_memory",
        # The sandbox function exists only with a sandbox server (it cannot host sandboxes);
        # /health is answered without one being reachable.
        "SANDBOX_BASE_URL": "http://127.0.0.1:9",
    }
    samples = []
    for _ in range(RUNS):
        result = subprocess.run(
            [sys.executable, "-S", "-c", PROBE, "agentscope_handler", kind, HEALTH_EVENT],
            cwd=function_dir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            last = result.stderr.strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{function_dir.name} failed: {last[0]}")
        sample = json.loads(result.stdout)
        # No sandbox server listens here: the sandbox function reports itself degraded (503).
        expected = 503 if function_dir.name == "SandboxFunction" else 200
        if sample["status"] != expected:
            raise SystemExit(f"{function_dir.name}: /health answered {sample['status']}")
        samples.append(sample)
    return {
        "import_s": statistics.median(s["import"] for s in samples),
        "import_cpu_s": statistics.median(s["import_cpu"] for s in samples),
        "first_response_s": statistics.median(s["first"] for s in samples),
    }


def main() -> None:
    if not (BUILD / "SharedLayer").exists():
        print("building with SAM...")
        sam.build(ROOT)
    layer = BUILD / "SharedLayer"
    layer_bytes = size_of(layer)
    rows = []
    for name, spec in sorted(sam.list_functions(ROOT / "template.yaml").items()):
        function_dir = BUILD / name
        kind = "factory" if spec.handler == "run.sh" else "handler"
        try:
            figures = probe(function_dir, layer, kind)
        except RuntimeError as failure:
            print(failure)
            continue
        rows.append(
            {
                "function": name,
                **{k: round(v, 4) for k, v in figures.items()},
                "function_bytes": size_of(function_dir),
                "layer_bytes": layer_bytes,
            }
        )
    header = (
        f"{'function':<24}{'import':>10}{'import CPU':>12}{'first response':>16}"
        f"{'code':>10}{'code+layer':>12}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['function']:<24}{row['import_s'] * 1000:>7.0f} ms"
            f"{row['import_cpu_s'] * 1000:>9.0f} ms"
            f"{row['first_response_s'] * 1000:>13.0f} ms"
            f"{row['function_bytes'] / 1024:>7.0f} KB"
            f"{(row['function_bytes'] + row['layer_bytes']) / 2**20:>9.1f} MB"
        )
    print(
        f"layer: {layer_bytes / 2**20:.1f} MB unpacked (budget {LAYER_BUDGET_BYTES / 2**20:.0f} MB)"
    )
    out = ROOT / "bench" / "results" / "cold_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"measured_at": time.time(), "layer_bytes": layer_bytes, "rows": rows}, indent=2)
        + "\n"
    )
    if layer_bytes > LAYER_BUDGET_BYTES:
        print(f"the layer is above the {LAYER_BUDGET_BYTES / 2**20:.0f} MB budget")
    for row in rows:
        if row["import_s"] > IMPORT_TARGET_S:
            print(
                f"{row['function']}: import above the {IMPORT_TARGET_S} s target (loaded machine?)"
            )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
