"""`fastgemma verify`: reproduce the challenge's TPS, PPL, greedy identity and private re-run.

The modules, in the order a run uses them:
- `config.py`: `VerifyConfig` (validated once; the server to start is an `EngineConfig`);
- `data.py`, `inputs.py`: prompt, PPL and reference files, and the samples drawn from them;
- `endpoint.py`: readiness polling and the `fastgemma serve` child process;
- `client.py`: the harness's HTTP requests and strict response parsing (`StageError`);
- `tps.py`, `audit.py`, `ppl.py`: the served stages; `reference.py`: the in-process plain path;
- `identity.py`, `verdict.py`: greedy identity and the VERIFIED / INVALID / PENDING verdict;
- `report.py`, `plots.py`: summary.json, requests.jsonl, record.md, PNG plots, the table;
- `run.py`: `run_verify(cfg)`, the orchestration.
"""

from fastgemma.verify.client import StageError
from fastgemma.verify.config import QUICK, VerifyConfig
from fastgemma.verify.run import run_verify

__all__ = ["QUICK", "StageError", "VerifyConfig", "run_verify"]
