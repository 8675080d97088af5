"""The search loop without servers: a fake `evaluate` gives each configuration an outcome, so
the budget, repeats, resume and the rule "a violating configuration never wins" are checked
exactly (the end-to-end run with real servers is in test_tune_end_to_end.py)."""

from __future__ import annotations

import pytest

from fastgemma.config import Tunable
from fastgemma.tune import leaderboard
from fastgemma.tune.space import Dimension, SearchSpace
from fastgemma.tune.study import measured_trials, open_study, outcome_of, search, winner
from fastgemma.tune.trial import Outcome

# int4-g32 is the fastest here but loses PPL; k=8 is fast but planted to break identity
SPEED = {"none": 50.0, "int8": 70.0, "int4-g32": 90.0}
SPACE = SearchSpace((
    Dimension("quantization", Tunable(choices=tuple(SPEED)), tuple(SPEED)),
    Dimension("speculative", Tunable(choices=("none", "ngram")), ("none", "ngram")),
    Dimension("num_speculative_tokens", Tunable(low=1, high=8, when=("speculative", ("ngram",))), ()),
))


def fake_evaluate(calls: list, prune: bool = False):
    def evaluate(options, number, best_tps):
        calls.append(options)
        tps = SPEED[options.quantization] * (1 + 0.1 * options.num_speculative_tokens if options.speculative == "ngram" else 1)
        ppl = 6.0 if options.quantization == "int4-g32" else 5.5
        identical = not (options.speculative == "ngram" and options.num_speculative_tokens == 8)
        if prune and best_tps is not None and tps <= best_tps:
            return Outcome(tps=tps, pruned=True)
        return Outcome(tps=tps, ppl=ppl, cap=5.5 * 1.05, identical=identical,
                       first_divergence={} if identical else {"p0": 3})
    return evaluate


def test_violating_configurations_never_win(tmp_path):
    calls: list = []
    study = open_study(tmp_path, {"setup": 1}, resume=False, seed=0)
    search(study, SPACE, fake_evaluate(calls), budget_trials=25, budget_minutes=None, progress=False)
    measured = measured_trials(study)
    assert len(measured) == len(calls) == 25  # repeats are answered from the study, never re-measured
    assert len({t.user_attrs["hash"] for t in measured}) == 25
    assert measured[0].number == 0 and calls[0].quantization == "none" and calls[0].speculative == "none"  # baseline
    statuses = {outcome_of(t).status for t in measured}
    assert {"ok", "ppl over cap", "identity broken"} <= statuses  # the planted violations were tried
    best = outcome_of(winner(study))
    fastest = max(outcome_of(t).tps for t in measured)
    assert best.feasible and best.tps < fastest  # something faster existed, and it violated a constraint
    w = winner(study).user_attrs["options"]
    assert w.get("quantization") != "int4-g32" and w.get("num_speculative_tokens") != 8
    table = leaderboard.rows(study)
    assert table[0]["trial"] == winner(study).number
    assert all(not r["feasible"] for r in table if r["status"] in ("ppl over cap", "identity broken", "failed", "invalid"))
    assert all(r["feasible"] for r in table if r["status"] == "ok")


def test_pruned_trials_count_but_never_win(tmp_path):
    calls: list = []
    study = open_study(tmp_path, {}, resume=False, seed=0)
    search(study, SPACE, fake_evaluate(calls, prune=True), budget_trials=12, budget_minutes=None, progress=False)
    measured = measured_trials(study)
    assert len(measured) == 12
    pruned = [t for t in measured if outcome_of(t).pruned]
    assert pruned and all(t.value == outcome_of(t).tps for t in pruned)  # TPE models their speed
    best = winner(study)
    assert best not in pruned and outcome_of(best).feasible
    assert all(outcome_of(t).tps <= outcome_of(best).tps for t in pruned)


def test_budget_counts_measured_trials_and_resume_continues(tmp_path):
    calls: list = []
    study = open_study(tmp_path, {"setup": 1}, resume=False, seed=0)
    search(study, SPACE, fake_evaluate(calls), budget_trials=3, budget_minutes=None, progress=False)
    assert len(measured_trials(study)) == 3
    first = [t.number for t in measured_trials(study)]

    with pytest.raises(ValueError, match="already holds a study: pass --resume"):
        open_study(tmp_path, {"setup": 1}, resume=False, seed=0)
    with pytest.raises(ValueError, match="other settings \\(setup\\)"):
        open_study(tmp_path, {"setup": 2}, resume=True, seed=0)
    with pytest.raises(ValueError, match="no study"):
        open_study(tmp_path / "empty", {"setup": 1}, resume=True, seed=0)

    resumed = open_study(tmp_path, {"setup": 1}, resume=True, seed=0)
    search(resumed, SPACE, fake_evaluate(calls), budget_trials=5, budget_minutes=None, progress=False)
    measured = measured_trials(resumed)
    assert len(measured) == 5 and [t.number for t in measured][:3] == first  # same study, two more
    assert len(calls) == 5 and calls[3].quantization is not None
    assert len({t.user_attrs["hash"] for t in measured}) == 5

    search(resumed, SPACE, fake_evaluate(calls), budget_trials=5, budget_minutes=None, progress=False)
    assert len(calls) == 5  # the budget is already spent


def test_a_small_space_is_exhausted_not_looped(tmp_path):
    space = SearchSpace((Dimension("quantization", Tunable(choices=("none", "int8")), ("none", "int8")),))
    calls: list = []
    study = open_study(tmp_path, {}, resume=False, seed=0)
    search(study, space, fake_evaluate(calls), budget_trials=10, budget_minutes=None, progress=False)
    assert sorted(o.quantization for o in calls) == ["int8", "none"]
