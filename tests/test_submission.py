"""Submission folders (fastgemma.submission): written from a preset, checked, and taken through
the challenge's own job script and scripts.

The official scripts are public, not ours: they stay in `../shared/harness` beside the
repository and are not copied here. The tests that run them skip where that folder is absent
(a user's clone); CI has it. They run the scripts unmodified, overriding only:
- the job script (`hf_bucket_single_job.py`): its functions `load_manifest`,
  `participant_env`, `build_serve_command`, `wait_for_models` and `terminate` are called as
  its `main()` calls them. `create_venv` is the one step done by hand, with the same
  dependency list: it runs `uv venv --python 3.12` and `uv pip install`, and on these
  machines neither Python 3.12 nor the CPU torch wheel is reachable by uv (pip's
  configuration points at the local wheel), so a `python -m venv` + `pip install` of the
  manifest's `dependencies` stands in. `HOST` is set to 127.0.0.1 in the environment the
  job copies, so the server binds the loopback address only;
- `decode_outputs.py`: arguments `--tokenizer` (the embedded model's converted tokenizer
  folder, with its chat template), `--num-prompts 3`, `--output-len 24`;
- `ppl_endpoint.py`: `--dataset-path` the first 4 challenge PPL records cut short (`small_ppl`);
- `check_greedy_identity.py`: run as is on the captured outputs against the plain path's.
Both scripts run with this environment's Python (the job uses a venv with transformers
5.9.0; they need only transformers and the standard library).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastgemma.cli.main import app
from fastgemma.config import EngineConfig
from fastgemma.preset import Preset, load_preset
from fastgemma.submission import check_submission, export_submission, pinned_requirements

HARNESS = Path(__file__).resolve().parents[1].parent / "shared" / "harness"
needs_harness = pytest.mark.skipif(
    not HARNESS.is_dir(),
    reason="the challenge's official scripts are not beside the repository (../shared/harness); "
           "they are public, not ours, so the repository does not copy them",
)


def _job_script():
    """The official job script as a module (its functions, unmodified)."""
    spec = importlib.util.spec_from_file_location("hf_bucket_single_job", HARNESS / "scripts" / "hf_bucket_single_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pinned_requirements_are_exact_and_carry_no_fastgemma():
    pins = pinned_requirements()
    names = [p.split("==")[0] for p in pins]
    assert all("==" in p and "+" not in p for p in pins)
    assert "torch" in names and "transformers" in names and "fastapi" in names
    assert "fastgemma" not in names  # it travels as source inside the folder
    assert "pytest" not in names  # no extras


def test_export_from_a_preset(tiny_text_model, tmp_path):
    preset = Preset(str(tiny_text_model), {"quantization": "int8", "lm_head_screen": False})
    folder = export_submission(tmp_path / "sub", preset, "tiny", port=8123, measured={"tps": 1.0})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["serve"] == ["python", "serve.py"] and manifest["port"] == 8123
    assert manifest["dependencies"] == pinned_requirements() and "pip" not in manifest
    assert manifest["model_id"] == f"model/{tiny_text_model.name}" and manifest["served_model_name"] == "tiny"
    assert (folder / manifest["model_id"] / "config.json").is_file()
    assert (folder / "src" / "fastgemma" / "__init__.py").is_file()
    assert (folder / "src" / "fastgemma" / "kernels" / "cpu_gemv.c").is_file()
    assert not list((folder / "src").rglob("__pycache__"))
    carried = load_preset(folder / "preset.json")
    assert carried.model is None and carried.options == preset.options  # MODEL_ID names the model
    assert check_submission(folder) == manifest


def test_a_hub_id_stays_a_hub_id_and_a_missing_path_is_refused(tmp_path):
    folder = export_submission(tmp_path / "hub", Preset("google/gemma-4-E4B-it", {}), "gemma-4-e4b-it")
    assert json.loads((folder / "manifest.json").read_text())["model_id"] == "google/gemma-4-E4B-it"
    assert not (folder / "model").exists()
    with pytest.raises(ValueError, match="does not exist"):
        export_submission(tmp_path / "missing", Preset(str(tmp_path / "nowhere.gguf"), {}), "x")


def test_a_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        export_submission(tmp_path, Preset("google/gemma-4-E4B-it", {}), "x")
    assert (tmp_path / "keep.txt").read_text() == "mine"


@needs_harness
def test_the_job_script_reads_the_manifest(tiny_text_model, tmp_path):
    job = _job_script()
    folder = export_submission(tmp_path / "sub", Preset(str(tiny_text_model), {}), "tiny")
    manifest = job.load_manifest(folder / "manifest.json")
    env = job.participant_env(manifest, folder, tmp_path / "venv", 8123)
    assert env["MODEL_ID"] == str(folder / "model" / tiny_text_model.name)  # resolved inside the submission
    assert env["SERVED_MODEL_NAME"] == "tiny" and env["PORT"] == "8123"
    assert job.build_serve_command(manifest["serve"], folder, tmp_path / "venv/bin/python") == [
        str(tmp_path / "venv/bin/python"), "serve.py"]


BROKEN = [
    ("serve", "python serve.py"),
    ("serve", []),
    ("serve", ["python", "missing.py"]),
    ("dependencies", "torch"),
    ("model_id", ""),
    ("model_id", "model/nothing-here.gguf"),
    ("port", "8000"),
    ("env", ["A=1"]),
]


@pytest.mark.parametrize("field,value", BROKEN)
def test_a_broken_manifest_names_the_field(tmp_path, field, value):
    folder = export_submission(tmp_path / "sub", Preset("google/gemma-4-E4B-it", {}), "x")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest[field] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"manifest field '{field}'"):
        check_submission(folder)
    result = CliRunner().invoke(app, ["submission", "--check", str(folder)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"'{field}'" in lines[0]


def test_a_missing_or_unreadable_manifest(tmp_path):
    with pytest.raises(ValueError, match="has no manifest.json"):
        check_submission(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="manifest.json is not JSON"):
        check_submission(tmp_path)


def test_cli_writes_and_checks(tmp_path):
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"fastgemma_preset": 1, "model": None, "options": {"quantization": "int8"}}))
    runner = CliRunner()
    written = runner.invoke(app, ["submission", "--preset", str(preset), "--out", str(tmp_path / "sub"),
                                  "--model", "google/gemma-4-E4B-it"])
    assert written.exit_code == 0, written.output
    assert load_preset(tmp_path / "sub" / "preset.json").options == {"quantization": "int8"}
    checked = runner.invoke(app, ["submission", "--check", str(tmp_path / "sub")])
    assert checked.exit_code == 0 and "ok" in checked.output
    neither = runner.invoke(app, ["submission"])
    assert neither.exit_code == 2 and "--out" in neither.output


@needs_harness
@pytest.mark.slow
def test_official_job_installs_starts_and_answers_the_official_scripts(tmp_path, small_ppl, monkeypatch):
    """The embedded model with n-gram speculation, exported, installed into a fresh venv,
    started as the job starts it, then measured by the official decode and PPL scripts; the
    official identity checker compares its greedy ids with the plain path's."""
    from fastgemma.data import PROMPTS_FILE, challenge_file
    from fastgemma.verify.audit import AuditPrompt
    from fastgemma.verify.endpoint import free_port
    from fastgemma.verify.reference import InProcessReference
    from fastgemma.weights.checkpoint import gguf_meta_folder
    from fastgemma.weights.source import embedded_model_path

    job = _job_script()
    folder = export_submission(tmp_path / "submission", Preset(None, {"speculative": "ngram"}), "gemma-3-270m")
    manifest = job.load_manifest(folder / "manifest.json")

    venv = tmp_path / "server-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *manifest["dependencies"]], check=True)

    monkeypatch.setenv("HOST", "127.0.0.1")
    port = free_port()
    env = job.participant_env(manifest, folder, venv, port)
    command = job.build_serve_command(manifest["serve"], folder, python)
    base_url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=os.setsid)
    try:
        job.wait_for_models(base_url, 600, proc)
        decode = [sys.executable, str(HARNESS / "scripts" / "decode_outputs.py"), "--base-url", base_url,
                  "--model", env["SERVED_MODEL_NAME"], "--dataset-path", str(challenge_file(PROMPTS_FILE)),
                  "--output-file", str(tmp_path / "decode_outputs.jsonl"),
                  "--summary-file", str(tmp_path / "decode_summary.json"),
                  "--tokenizer", str(gguf_meta_folder(embedded_model_path())),
                  "--num-prompts", "3", "--output-len", "24", "--seed", "1"]
        subprocess.run(decode, check=True, timeout=600)
        ppl = [sys.executable, str(HARNESS / "scripts" / "ppl_endpoint.py"), "--base-url", base_url,
               "--model", env["SERVED_MODEL_NAME"], "--dataset-path", str(small_ppl),
               "--output-file", str(tmp_path / "ppl.jsonl"), "--summary-file", str(tmp_path / "ppl_summary.json")]
        subprocess.run(ppl, check=True, timeout=600)
    finally:
        job.terminate(proc)
        log.close()
    assert proc.returncode is not None
    assert "--speculative" not in " ".join(command)  # the options travel in preset.json

    captured = [json.loads(line) for line in (tmp_path / "decode_outputs.jsonl").read_text().splitlines()]
    assert len(captured) == 3 and all(len(r["completion_token_ids"]) == 24 for r in captured)
    assert all(r["prompt_token_ids"][:3] == [2, 105, 2364] for r in captured)  # <bos><start_of_turn>user: the template
    summary = json.loads((tmp_path / "ppl_summary.json").read_text())
    assert summary["num_records"] == 4 and 1.0 < summary["ppl"] < 1000.0

    reference = InProcessReference(EngineConfig(), progress=False).greedy(
        [AuditPrompt(r["id"], r["prompt_token_ids"]) for r in captured], 24)
    ref_path = tmp_path / "reference.jsonl"
    ref_path.write_text("".join(json.dumps({"id": k, "completion_token_ids": v}) + "\n" for k, v in reference.items()))
    checker = subprocess.run([sys.executable, str(HARNESS / "greedy_identity_verifier" / "check_greedy_identity.py"),
                              "--reference", str(ref_path), "--candidate", str(tmp_path / "decode_outputs.jsonl")],
                             capture_output=True, text=True, timeout=60)
    assert checker.returncode == 0, checker.stdout + checker.stderr
    assert "GREEDY_IDENTICAL" in checker.stdout
