"""An `EngineConfig` maps onto the server's flags (`serve_args`) and the references (`plain`);
with `--quantization` the PPL reference is the unquantised model and greedy identity is
checked against the quantised model's own plain path."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fastgemma import LLM, SamplingParams
from fastgemma.config import EngineConfig
from fastgemma.verify.audit import AuditPrompt
from fastgemma.verify.data import PplRecord
from fastgemma.verify.reference import InProcessReference


def test_quantization_flag_and_reference_kwargs():
    plain = EngineConfig(model="m", dtype="float32")
    assert "--quantization" not in plain.serve_args()
    assert plain.plain() == plain.unquantized().plain()

    q = EngineConfig(model="m", dtype="float32", quantization="int4-g32")
    args = q.serve_args()
    assert args[args.index("--quantization") + 1] == "int4-g32"
    assert q.plain().quantization == "int4-g32"
    assert q.unquantized().plain() == replace(q.plain(), quantization="none")


def test_speculative_flags_reach_the_server_but_not_the_reference():
    mtp = EngineConfig(model="m", speculative="mtp", num_speculative_tokens=6, draft_model="assistant")
    args = mtp.serve_args()
    assert args[args.index("--speculative") + 1 :][:5] == ["mtp", "--num-speculative-tokens", "6", "--draft-model", "assistant"]
    assert (mtp.plain().speculative, mtp.plain().draft_model) == ("none", None)  # identity vs plain decoding
    with pytest.raises(ValueError, match="--draft-model"):
        EngineConfig(speculative="mtp")
    with pytest.raises(ValueError, match="--draft-model"):
        EngineConfig(draft_model="assistant")


def test_unknown_quantization_names_the_choices():
    with pytest.raises(ValueError, match="unknown quantization 'int3' for --quantization.*int8, int4-g32"):
        EngineConfig(quantization="int3")


def test_reference_scores_unquantised_and_decodes_quantised(tiny_text_model):
    serve = EngineConfig(model=str(tiny_text_model), dtype="float32", quantization="int8")
    ref = InProcessReference(serve.unquantized(), serve, progress=False)
    record = PplRecord(key="r0", context_token_ids=[2, 17, 301, 5, 88], target_token_ids=[9, 40, 7, 120])
    prompt = AuditPrompt(key="p0", prompt_token_ids=[2, 9, 9, 44, 120, 7])

    ppl = ref.ppl([record]).ppl
    greedy = ref.greedy([prompt], 10)["p0"]

    ids = record.context_token_ids + record.target_token_ids
    plain, quantised = LLM(str(tiny_text_model), dtype="float32"), LLM(str(tiny_text_model), dtype="float32", quantization="int8")
    n = len(record.target_token_ids)
    assert ppl == pytest.approx(_ppl(plain.score(ids)[-n:]), rel=1e-5)
    assert ppl != pytest.approx(_ppl(quantised.score(ids)[-n:]), rel=1e-7)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    assert greedy == list(quantised.generate([prompt.prompt_token_ids], params)[0].token_ids)


def _ppl(logprobs: list[float]) -> float:
    import math

    return math.exp(-sum(logprobs) / len(logprobs))


def test_verify_starts_a_quantised_server_end_to_end(tiny_text_model, small_prompts, small_ppl, tmp_path):
    from fastgemma.verify.config import VerifyConfig
    from fastgemma.verify.run import run_verify

    serve = EngineConfig(model=str(tiny_text_model), dtype="float32", quantization="int8")
    cfg = VerifyConfig(serve=serve, prompts=small_prompts, ppl_data=small_ppl, num_prompts=2, num_private_prompts=2,
                       output_len=8, warmup=1, out=tmp_path, progress=False)
    summary = run_verify(cfg, log=lambda m: None)
    assert summary["endpoint"]["serve_args"][-2:] == ["--quantization", "int8"]
    assert "quantization int8" in (tmp_path / "serve.log").read_text()
    assert summary["quantization"] == "int8"
    assert summary["identity"]["holds"] is True  # served int8 == the int8 model's plain path
    assert summary["ppl_delta"] == pytest.approx(summary["ppl"] / summary["reference_ppl"] - 1)
    assert summary["ppl_delta"] != 0.0  # the reference is the unquantised model
    assert "int8" in (tmp_path / "record.md").read_text()
    assert summary["server_resident_mib"] > 100  # the served process's memory, read from its /metrics
    assert "server resident memory after the run" in (tmp_path / "record.md").read_text()
