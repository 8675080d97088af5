"""Memory and start-up of the embedded model (README "Memory and start-up"; issue targets).

    python benchmarks/memory_startup.py [--requests 10] [--skip-cold]

Each figure comes from a fresh process:
- `LLM()` with the defaults, warm (ready-form cache filled) and, unless --skip-cold, with the
  ready cache off (`FASTGEMMA_READY_CACHE=0`: the GGUF parsed and dequantised, the screen
  built): seconds to construct (torch's import included), resident and peak memory after it;
- `fastgemma serve` (defaults; then `--dtype float32`): seconds until GET /v1/models answers
  200, then resident and peak memory of the server process after N chat completions of
  64 tokens (targets: <= 1.25 GiB bf16, <= 2.0 GiB fp32, ready <= 10 s);
- `fastgemma --help`: the median of 5 runs (target <= 1 s).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from fastgemma.memory import peak_resident_bytes, resident_bytes
from fastgemma.verify.endpoint import free_port, serve_command

_LOAD = """
import json, time
t = time.perf_counter()
from fastgemma import LLM
llm = LLM()
seconds = time.perf_counter() - t
from fastgemma.memory import peak_resident_bytes, resident_bytes
print(json.dumps(dict(seconds=seconds, rss=resident_bytes(), peak=peak_resident_bytes(),
                      kv=llm.runner.pool.num_bytes)))
"""


def load(ready_cache: bool) -> dict:
    env = {**os.environ, "FASTGEMMA_READY_CACHE": "1" if ready_cache else "0"}
    out = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve(args: list[str], requests_n: int) -> dict:
    import requests

    port = free_port()
    t = time.perf_counter()
    proc = subprocess.Popen(serve_command(args, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fastgemma serve {args} exited with {proc.returncode}")
            try:
                if requests.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.05)
        ready = time.perf_counter() - t
        model = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for i in range(requests_n):
            body = {"model": model, "max_tokens": 64, "temperature": 0.0,
                    "messages": [{"role": "user", "content": f"Tell me about the number {i}."}]}
            r = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
            r.raise_for_status()
        return dict(ready=ready, rss=resident_bytes(proc.pid), peak=peak_resident_bytes(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)


def help_seconds() -> float:
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fastgemma.cli.main", "--help"], capture_output=True, check=True)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--skip-cold", action="store_true")
    a = ap.parse_args()
    gib = 2.0**30
    rows, result = [], {}
    load(True)  # fills the ready cache if empty
    result["load_warm"] = w = load(True)
    rows.append(("LLM() warm", f"{w['seconds']:.1f} s", f"{w['rss'] / gib:.2f}", f"{w['peak'] / gib:.2f}", ""))
    if not a.skip_cold:
        result["load_no_ready_cache"] = c = load(False)
        rows.append(("LLM() without the ready cache", f"{c['seconds']:.1f} s", f"{c['rss'] / gib:.2f}",
                     f"{c['peak'] / gib:.2f}", ""))
    for name, args, target in (("serve (bf16)", [], 1.25), ("serve --dtype float32", ["--dtype", "float32"], 2.0)):
        s = result[name] = serve(args, a.requests)
        rows.append((f"{name}, after {a.requests} requests", f"ready {s['ready']:.1f} s", f"{s['rss'] / gib:.2f}",
                     f"{s['peak'] / gib:.2f}", f"<= {target} GiB resident, ready <= 10 s"))
    result["help_seconds"] = h = help_seconds()
    rows.append(("fastgemma --help (median of 5)", f"{h:.2f} s", "", "", "<= 1 s"))
    print(f"{'what':44} {'time':>12} {'RSS GiB':>8} {'peak GiB':>8}  target")
    for row in rows:
        print(f"{row[0]:44} {row[1]:>12} {row[2]:>8} {row[3]:>8}  {row[4]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
