"""`run_tune`'s orchestration with the servers replaced: a winner that fails greedy identity
when re-verified is rejected and the next best is re-verified and exported."""

from __future__ import annotations

import json

from fastgemma.config import Tunable
from fastgemma.preset import load_preset
from fastgemma.tune import TuneConfig, run_tune
from fastgemma.tune import run as tune_run
from fastgemma.tune.space import Dimension, SearchSpace
from fastgemma.tune.trial import Outcome

SPEED = {"none": 50.0, "int8": 70.0, "int4-g32": 90.0}


def test_a_winner_that_fails_reverification_gives_way(small_prompts, small_ppl, tmp_path, monkeypatch):
    def evaluate(options, sample, refs, folder, ready_timeout_s, prune_at_or_below=None):
        return Outcome(tps=SPEED[options.quantization], ppl=5.5, cap=5.8, identical=True, served_model_name="m")

    verified = []

    def run_verify(cfg, log):
        verified.append(cfg.serve.quantization)
        broken = cfg.serve.quantization == "int4-g32"  # identical on the tuning audit, not on all prompts
        checks = [{"name": "tps re-run", "status": "pass", "detail": ""},
                  {"name": "greedy identity", "status": "fail" if broken else "pass", "detail": "1 of 3 prompts diverge"}]
        return {"verdict": "INVALID" if broken else "VERIFIED", "reasons": ["greedy identity: 1 of 3 prompts diverge"] if broken else [],
                "checks": checks, "tps": 60.0, "private_tps": 61.0, "tps_change": 0.016, "ppl": 5.5, "cap": 5.8,
                "outputs": {"record": str(cfg.out / "record.md")}}

    class References:
        def __init__(self, *args):
            pass

        def ppl(self, options):
            return 5.5

    monkeypatch.setattr(tune_run, "evaluate", evaluate)
    monkeypatch.setattr(tune_run, "run_verify", run_verify)
    monkeypatch.setattr(tune_run, "References", References)
    space = SearchSpace((Dimension("quantization", Tunable(choices=tuple(SPEED)), tuple(SPEED)),), model="org/m")
    cfg = TuneConfig(model="org/m", prompts=small_prompts, ppl_data=small_ppl, num_prompts=3, num_audit_prompts=2,
                     num_ppl_records=2, budget_trials=3, out=tmp_path, progress=False)
    summary = run_tune(cfg, space=space, log=lambda _: None)

    assert verified == ["int4-g32", "int8"]  # fastest first, then the next best
    assert summary["winner"]["options"] == {"quantization": "int8"} and summary["verification"]["verdict"] == "VERIFIED"
    assert list(summary["rejected"].values()) == [["greedy identity: 1 of 3 prompts diverge"]]
    board = {r["options"].get("quantization", "none"): r for r in json.loads((tmp_path / "leaderboard.json").read_text())}
    assert board["int4-g32"]["status"] == "rejected by re-verification" and not board["int4-g32"]["feasible"]
    assert load_preset(tmp_path / "preset.json").options == {"quantization": "int8"}
    assert json.loads((tmp_path / "submission" / "manifest.json").read_text())["served_model_name"] == "m"
