"""The search: an optuna study over the space, persisted in SQLite, under a budget.

Why optuna's TPE sampler: the space is categorical and conditional (K exists only with a
speculative method), a trial costs a server start and a minute or so of decoding, so the
budget is tens of trials, and a study must survive interruption. TPE models categorical and
conditional parameters directly (define-by-run, `group=True`), steers away from infeasible
configurations through the trials' constraints (`Trial.set_constraint`: PPL over the cap,
identity broken, a failed start), and optuna persists every trial in SQLite, so `--resume` is loading the study.
CMA-ES (nevergrad's or optuna's) wants continuous parameters; nevergrad's discrete
strategies have no persistence of their own.

Trial 0 of a new study is the engine's defaults (the baseline). A configuration the engine
refuses is pruned without a server; one whose TPS does not beat the best feasible so far is
pruned after its TPS run (trial.py: it cannot win, so it is not judged); one already measured is answered from the study (no
second server) and, since TPE on a small discrete space keeps proposing its best, the next
trial is queued one option away from it, unmeasured (`SearchSpace.neighbours`: a
mutation step, as in an evolutionary search); neither counts against `budget_trials`. A new
best feasible configuration also queues one neighbour of itself (exploitation, beside TPE's
model). A violating configuration is never
the winner: `winner()` takes the fastest trial whose outcome is feasible.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fastgemma.config import EngineConfig
from fastgemma.tune.space import SearchSpace, config_hash
from fastgemma.tune.trial import Outcome

STUDY_NAME = "fastgemma-tune"
STORAGE_FILE = "study.db"
STARTUP_TRIALS = 5  # random configurations before TPE models the results
MAX_ATTEMPTS_PER_TRIAL = 20  # suggestions per measured trial before the space counts as exhausted

# (options, trial number, best feasible TPS so far or None) -> outcome
Evaluate = Callable[[EngineConfig, int, float | None], Outcome]


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def open_study(out: Path, setup: dict[str, Any], resume: bool, seed: int) -> Any:
    """The study in `out/study.db`: new (refusing to overwrite one), or resumed (same setup)."""
    optuna = _optuna()
    db = Path(out) / STORAGE_FILE
    if db.exists() and not resume:
        raise ValueError(f"{out} already holds a study: pass --resume to continue it, or choose another --out")
    if resume and not db.exists():
        raise ValueError(f"--resume: there is no study in {out} ({STORAGE_FILE} not found)")
    Path(out).mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{db}"
    if resume:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
        old = study.user_attrs.get("setup")
        if old != setup:
            changed = sorted(k for k in set(old or {}) | set(setup) if (old or {}).get(k) != setup.get(k))
            raise ValueError(f"--resume: the study in {out} was run with other settings ({', '.join(changed)}); "
                             "give the same ones, or choose another --out")
    else:
        study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize")
        study.set_user_attr("setup", setup)
    sampler = optuna.samplers.TPESampler(
        seed=seed + len(study.trials), n_startup_trials=STARTUP_TRIALS, multivariate=True, group=True,
    )
    return optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler)


def measured_trials(study: Any) -> list[Any]:
    """Trials that ran a server (not pruned, not answered from an earlier trial)."""
    return [t for t in study.trials if t.user_attrs.get("measured")]


def outcome_of(trial: Any) -> Outcome | None:
    d = trial.user_attrs.get("outcome")
    return Outcome.from_dict(d) if d is not None else None


def ranked(study: Any) -> list[Any]:
    """Measured trials whose outcome is feasible, fastest first."""
    feasible = [t for t in measured_trials(study) if outcome_of(t).feasible]
    return sorted(feasible, key=lambda t: -outcome_of(t).tps)


def winner(study: Any) -> Any | None:
    """The fastest measured trial whose outcome is feasible; None when there is none."""
    return next(iter(ranked(study)), None)


def _queue_neighbour(study: Any, space: SearchSpace, params: dict[str, Any], seen: set[str],
                     rng: random.Random, tries: int = 200) -> None:
    """Queue the first valid, unmeasured configuration near `params` (none: the space is spent)."""
    for _, values in zip(range(tries), space.neighbours(params, rng)):
        try:
            if config_hash(space.options(values)) not in seen:
                study.enqueue_trial(values)
                return
        except ValueError:
            continue


def _set_constraints(trial: Any, outcome: Outcome) -> None:
    """A pruned trial is modelled by its TPS as if feasible: it was not judged, and its speed
    is what tells TPE where the fast configurations are (it never wins: `winner` takes judged
    trials only)."""
    ppl, identity = (0.0, 0.0) if outcome.pruned else outcome.constraints()
    trial.set_constraint("ppl_over_cap", ppl)
    trial.set_constraint("identity_broken", identity)


def search(study: Any, space: SearchSpace, evaluate: Evaluate, budget_trials: int | None,
           budget_minutes: float | None, progress: bool = True) -> None:
    """Run trials until `budget_trials` are measured or `budget_minutes` pass (or the space is exhausted)."""
    optuna = _optuna()
    if not study.trials:
        study.enqueue_trial(space.default_params())
    seen = {t.user_attrs["hash"]: t for t in measured_trials(study)}
    start_count, attempts = len(seen), 0
    rng = random.Random(len(study.trials))

    def objective(trial: Any) -> float:
        try:
            options = space.suggest(trial)
        except ValueError as e:
            _set_constraints(trial, Outcome(error="invalid"))
            trial.set_user_attr("invalid", " ".join(str(e).split()))
            raise optuna.TrialPruned(str(e)) from None
        h, best = config_hash(options), winner(study)
        trial.set_user_attr("hash", h)
        trial.set_user_attr("options", options.changed())
        if h in seen:
            trial.set_user_attr("repeat_of", seen[h].number)
            outcome = outcome_of(seen[h])
            _queue_neighbour(study, space, trial.params, set(seen), rng)
        else:
            outcome = evaluate(options, trial.number, outcome_of(best).tps if best else None)
            trial.set_user_attr("measured", True)
        trial.set_user_attr("outcome", outcome.to_dict())
        _set_constraints(trial, outcome)
        if outcome.feasible and (best is None or outcome.tps > outcome_of(best).tps):
            _queue_neighbour(study, space, trial.params, set(seen) | {h}, rng)  # exploit a new best
        return outcome.tps or 0.0

    bar = tqdm(total=budget_trials, initial=start_count, desc="tune", unit="trial", disable=not progress)

    def after(study: Any, trial: Any) -> None:
        nonlocal attempts
        attempts += 1
        if trial.user_attrs.get("measured"):
            seen[trial.user_attrs["hash"]] = trial
            o = outcome_of(trial)
            best = winner(study)
            bar.update()
            bar.set_postfix_str(f"last {o.tps or 0:.1f} tok/s {o.status}; best "
                                + (f"{outcome_of(best).tps:.1f} tok/s (#{best.number})" if best else "none yet"))
        done = budget_trials is not None and len(seen) >= budget_trials
        exhausted = attempts >= MAX_ATTEMPTS_PER_TRIAL * max(1, len(seen) - start_count + 1)
        if done or exhausted:
            study.stop()

    deadline = budget_minutes * 60.0 if budget_minutes is not None else None
    started = time.monotonic()
    with bar:
        if budget_trials is None or len(seen) < budget_trials:
            study.optimize(objective, timeout=deadline, callbacks=[after], catch=())
    study.set_user_attr("last_search_seconds", round(time.monotonic() - started, 1))
