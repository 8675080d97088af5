"""`fastgemma tune` end to end on the tiny random Gemma 3: real servers, a short budget.

One study is run once for the module (2 configurations, the winner re-verified), then resumed;
a second study plants a bug (quantisation declared as if it did not change the model's
numbers, so the identity reference stays unquantised) and must never pick the configuration
that breaks identity; the exported preset and submission folder start servers that answer
the challenge's requests.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from fastgemma.config import EngineConfig, Tunable
from fastgemma.preset import load_preset
from fastgemma.submission import check_submission
from fastgemma.tune import TuneConfig, run_tune
from fastgemma.tune.space import Dimension, SearchSpace
from fastgemma.verify.endpoint import ServeProcess, free_port


def _config(model: Path, prompts: Path, ppl: Path, out: Path, **kw) -> TuneConfig:
    sizes = dict(num_prompts=3, num_holdout_prompts=3, num_audit_prompts=2, num_ppl_records=2, output_len=12,
                 warmup=0, budget_trials=2, ready_timeout_s=180, progress=False)
    return TuneConfig(model=str(model), prompts=prompts, ppl_data=ppl, out=out, **{**sizes, **kw})


@pytest.fixture(scope="module")
def tuned(tiny_text_model, small_prompts, small_ppl, tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    summary = run_tune(_config(tiny_text_model, small_prompts, small_ppl, out), log=lambda _: None)
    return out, summary


def test_short_budget_end_to_end(tuned):
    out, summary = tuned
    assert summary["measured"] == 2 and summary["winner"] is not None
    w = summary["winner"]
    assert w["feasible"] and w["identical"] and w["ppl"] <= w["cap"] and w["tps"] > 0
    assert summary["baseline_tps"] > 0  # trial 0: the engine's defaults
    board = json.loads((out / "leaderboard.json").read_text())
    measured = [r for r in board if r["status"] != "invalid" and "repeat" not in r["status"]]
    assert len(measured) == 2 and board[0]["hash"] == w["hash"]
    assert all({"tps", "ppl", "identical", "acceptance", "options", "hash"} <= set(r) for r in measured)
    assert w["hash"] in (out / "leaderboard.md").read_text()
    assert (out / "tps_over_trials.png").read_bytes()[:4] == b"\x89PNG"
    for r in measured:
        trial = json.loads(next((out / "trials").glob(f"{r['trial']:03d}-{r['hash']}/trial.json")).read_text())
        assert trial["trial"] == r["trial"] and trial["options"] == r["options"] and trial["tps"] == r["tps"]
    v = summary["verification"]
    assert v["verdict"] in ("VERIFIED", "INVALID") and isinstance(v["reasons"], list)
    record = Path(v["record"]).read_text()
    assert "greedy identity" in record  # the full verifier ran on the winner
    checks = {c["name"]: c["status"] for c in json.loads((out / f"verify-trial-{w['trial']:03d}" / "summary.json").read_text())["checks"]}
    assert checks["greedy identity"] == "pass" and checks["ppl cap"] == "pass"
    assert json.loads((out / "tune.json").read_text())["winner"]["hash"] == w["hash"]


def test_resume_continues_the_same_study(tuned, tiny_text_model, small_prompts, small_ppl):
    out, first = tuned
    before = json.loads((out / "leaderboard.json").read_text())
    with pytest.raises(ValueError, match="--resume"):
        run_tune(_config(tiny_text_model, small_prompts, small_ppl, out), log=lambda _: None)
    with pytest.raises(ValueError, match="other settings"):
        run_tune(_config(tiny_text_model, small_prompts, small_ppl, out, output_len=10, resume=True), log=lambda _: None)
    summary = run_tune(_config(tiny_text_model, small_prompts, small_ppl, out, budget_trials=3, resume=True,
                               verify_winner=False), log=lambda _: None)
    assert summary["measured"] == 3
    after = json.loads((out / "leaderboard.json").read_text())
    old = {(r["trial"], r["hash"], r.get("tps")) for r in before if r["status"] != "invalid"}
    assert old <= {(r["trial"], r["hash"], r.get("tps")) for r in after}  # earlier trials kept as measured


def test_planted_identity_breaker_is_never_selected(tiny_text_model, small_prompts, small_ppl, tmp_path, monkeypatch):
    # the planted bug: quantisation treated as a speed-only option, so the identity reference
    # is the unquantised model while the server quantises to int4
    real = EngineConfig.plain
    monkeypatch.setattr(EngineConfig, "plain", lambda self: replace(real(self), quantization="none"))
    choices = ("none", "int4-g32")
    space = SearchSpace((Dimension("quantization", Tunable(choices=choices), choices),), model=str(tiny_text_model))
    summary = run_tune(_config(tiny_text_model, small_prompts, small_ppl, tmp_path, verify_winner=False, prune=False),
                       space=space, log=lambda _: None)
    board = {r["options"].get("quantization", "none"): r for r in json.loads((tmp_path / "leaderboard.json").read_text())
             if "repeat" not in r["status"]}
    assert board["int4-g32"]["status"] == "identity broken" and board["int4-g32"]["first_divergence"]
    assert board["none"]["status"] == "ok"
    assert summary["winner"]["options"] == {}  # the unquantised baseline, whatever int4's speed


def _challenge_requests(url: str, name: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == name
        chat = c.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 6, "ignore_eos": True, "temperature": 0})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 6
        ids = [2, 17, 301, 5, 88, 9]
        ppl = c.post("/v1/completions", json={"model": name, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                                              "prompt_logprobs": 1, "add_special_tokens": False, "return_token_ids": True})
        logprobs = ppl.json()["choices"][0]["prompt_logprobs"]
        assert logprobs[0] is None and all(str(t) in entry for t, entry in zip(ids[1:], logprobs[1:]))
        audit = c.post("/v1/completions", json={"model": name, "prompt": ids, "max_tokens": 5, "temperature": 0,
                                                "ignore_eos": True, "add_special_tokens": False, "return_token_ids": True})
        assert len(audit.json()["choices"][0]["token_ids"]) == 5


def test_exported_preset_and_submission_serve(tuned, tiny_text_model, tmp_path):
    out, _ = tuned
    summary = json.loads((out / "tune.json").read_text())  # the latest run's (the resumed one, if it ran)
    preset = load_preset(out / "preset.json")
    assert preset.model == str(tiny_text_model) and preset.options == summary["winner"]["options"]

    port = free_port()
    command = [os.sys.executable, "-m", "fastgemma.cli.main", "serve", "--preset", str(out / "preset.json"),
               "--served-model-name", "tuned", "--port", str(port)]
    with ServeProcess(command, port, tmp_path / "preset.log", ready_timeout_s=180) as proc:
        _challenge_requests(proc.url, "tuned")

    submission = Path(summary["submission"])
    manifest = check_submission(submission)
    assert {"model_id", "served_model_name", "port", "serve", "dependencies", "env"} <= set(manifest)
    assert manifest["model_id"] == f"model/{tiny_text_model.name}" and manifest["serve"] == ["python", "serve.py"]
    assert load_preset(submission / "preset.json").options == preset.options
    port = free_port()
    env = {**os.environ, "MODEL_ID": str(submission / manifest["model_id"]), "SERVED_MODEL_NAME": "google/gemma-4-E4B-it",
           "HOST": "127.0.0.1", "PORT": str(port)}
    command = [os.sys.executable, "serve.py"]  # run in the folder, as the challenge's job runs it
    with ServeProcess(command, port, tmp_path / "submission.log", ready_timeout_s=180, env=env, cwd=submission) as proc:
        _challenge_requests(proc.url, "google/gemma-4-E4B-it")
    assert "serving 'google/gemma-4-E4B-it'" in (tmp_path / "submission.log").read_text()
