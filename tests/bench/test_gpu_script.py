"""benchmarks/gpu_e4b.py, the prepared GPU check, in its CPU smoke mode: every phase runs and
reports, so the script is ready for the sessions that get a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_e4b.py"


def test_the_gpu_script_runs_every_phase_on_a_tiny_model(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--shape", "tiny", "--device", "cpu", "--prompt-len", "40",
           "--output-len", "24", "--max-model-len", "256", "--repetitions", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads((out / "result.json").read_text())
    phases = result["phases"]
    assert set(phases) == {"bandwidth", "build", "decode", "transformers", "ngram", "int4-g128", "int8", "int4-g32"}
    assert not [name for name, p in phases.items() if "error" in p]
    assert phases["decode"]["graph_tokens_equal_eager"] and phases["ngram"]["tokens_equal_plain"]
    assert sorted(phases["ngram"]["step_ms_by_k"], key=int) == [str(k) for k in range(9)]
    assert all(phases[s]["graph_tokens_equal_eager"] for s in ("int4-g128", "int8", "int4-g32"))
    assert phases["int4-g128"]["bytes_per_token"] < phases["int8"]["bytes_per_token"] < phases["decode"]["bytes_per_token"]
