"""`fastgemma tune`: search the engine's options for the fastest configuration that stays faithful.

The modules, in the order a run uses them:
- `config.py`: `TuneConfig` (validated once);
- `space.py`: the search space, read from `EngineConfig`'s option metadata (config.py);
- `references.py`: the plain-path references (greedy ids, PPL), computed once per checkpoint
  numerics and cached in the study folder;
- `trial.py`: one configuration measured by the verifier's stages in a fresh `fastgemma serve`;
- `study.py`: the optuna study (TPE, SQLite, resumable), the budget and the progress bar;
- `leaderboard.py`: every trial as markdown and JSON, and the TPS-over-trials plot;
- `export.py`: the winner as a serve preset and a challenge submission folder;
- `run.py`: `run_tune(cfg)`, the orchestration (search, re-verify the winner, export).
"""

from fastgemma.tune.config import TuneConfig
from fastgemma.tune.run import run_tune

__all__ = ["TuneConfig", "run_tune"]
