"""`fastgemma bench decode` end to end on a tiny model, and the cost model's byte count."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fastgemma import LLM
from fastgemma.bench.cost_model import bytes_per_token, kv_bytes_per_token, weight_bytes_per_token
from fastgemma.cli.main import app


def test_cost_model_counts_every_weight(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=64)
    m, spec = llm.model, llm.spec
    # Every matrix once (the tied embedding as lm_head), plus one row of each embedding table.
    matrices = sum(p.numel() for name, p in m.named_parameters() if name != "embed_tokens_per_layer.weight")
    row_ple = spec.num_layers * spec.per_layer_input_size
    assert weight_bytes_per_token(m) == 4 * (matrices + spec.hidden_size + row_ple)
    # 5 cache layers; the 3 shared layers read their sources' K/V too (sources 2, 4, 2).
    per_pos = {i: 2 * spec.layers[i].num_kv_heads * spec.layers[i].head_dim * 4 for i in spec.cache_layers}
    readers = {0: 1, 1: 1, 2: 3, 3: 1, 4: 2}
    ctx = 20  # past the window (8) on sliding layers
    expected = sum(readers[i] * per_pos[i] * (min(ctx, 8) if spec.layers[i].is_sliding else ctx) for i in per_pos)
    assert kv_bytes_per_token(m, ctx) == expected
    assert bytes_per_token(m, ctx) == weight_bytes_per_token(m) + expected


def test_bench_decode_json(tiny_text_model, tmp_path):
    prompts = tmp_path / "p.json"
    items = [{"conversations": [{"from": "human", "value": f"Question {i}: why?"}, {"from": "gpt", "value": "x"}]} for i in range(2)]
    prompts.write_text(json.dumps(items))
    result = CliRunner().invoke(
        app,
        ["bench", "decode", "--model", str(tiny_text_model), "--prompts", str(prompts), "--num-prompts", "2",
         "--output-len", "8", "--dtype", "float32", "--compare", "transformers,llama.cpp", "--json"],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    fg = out["engines"]["fastgemma"]
    assert fg["decode_tok_s"] > 0 and fg["prefill_tok_s"] > 0 and fg["bandwidth_fraction"] > 0
    assert "transformers" in out["engines"]
    for s in out["engines"].values():  # each engine's memory, its load and warm-up alone
        assert 0 < s["resident_mib"] <= s["peak_mib"] < out["peak_resident_mib"], s
    assert out["greedy_identity_vs_plain_path"] == {
        "checked": True, "fastgemma": {"identical_prompts": 2, "prompts": 2, "first_divergence": [None, None]}
    }
    assert any("llama.cpp skipped" in n for n in out["notes"])  # a safetensors folder has no GGUF


def test_bench_decode_schemes_side_by_side_with_ppl(tiny_text_model, tmp_path):
    prompts = tmp_path / "p.json"
    items = [{"conversations": [{"from": "human", "value": "Tell me a story."}]}]
    prompts.write_text(json.dumps(items))
    ppl = tmp_path / "ppl.jsonl"
    ppl.write_text("\n".join(json.dumps({"id": i, "context_token_ids": [2, 5 + i, 9], "target_token_ids": [7, 8, 11, 3]}) for i in range(2)))
    result = CliRunner().invoke(
        app,
        ["bench", "decode", "--model", str(tiny_text_model), "--prompts", str(prompts), "--num-prompts", "1",
         "--output-len", "12", "--dtype", "bfloat16", "--quantization", "none,int8,int4-g32",
         "--ppl-records", "2", "--ppl-data", str(ppl), "--json"],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    engines = out["engines"]
    assert set(engines) == {"fastgemma", "fastgemma int8", "fastgemma int4-g32"}
    assert engines["fastgemma"]["ppl_delta_pct"] == 0 and engines["fastgemma"]["ppl_tokens"] == 8
    assert engines["fastgemma int8"]["bytes_per_token"] < engines["fastgemma"]["bytes_per_token"]
    assert engines["fastgemma int4-g32"]["bytes_per_token"] < engines["fastgemma int8"]["bytes_per_token"]
    assert all(e["ppl"] > 1 for e in engines.values())
    for name in engines:
        assert out["greedy_identity_vs_plain_path"][name]["identical_prompts"] == 1


def test_bench_rejects_unknown_scheme():
    result = CliRunner().invoke(app, ["bench", "decode", "--quantization", "int3"])
    assert result.exit_code == 2 and "unknown quantization 'int3'" in result.output


def test_bench_rejects_bad_prompts_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    result = CliRunner().invoke(app, ["bench", "decode", "--prompts", str(bad)])
    assert result.exit_code == 2 and "cannot read sharegpt prompts" in result.output


def test_bench_names_the_bad_record(tmp_path):
    prompts = tmp_path / "p.json"
    good = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "x"}]}
    prompts.write_text(json.dumps([good, {"conversations": "oops"}]))
    result = CliRunner().invoke(app, ["bench", "decode", "--prompts", str(prompts), "--num-prompts", "2"])
    assert result.exit_code == 2 and f"{prompts}" in result.output and "item 1" in result.output
    ppl = tmp_path / "ppl.jsonl"
    ppl.write_text(json.dumps({"context_token_ids": [2], "target_token_ids": [3]}) + "\n{\"context_token_ids\": 5}\n")
    result = CliRunner().invoke(app, ["bench", "decode", "--prompts", str(prompts), "--num-prompts", "1",
                                      "--ppl-records", "2", "--ppl-data", str(ppl)])
    assert result.exit_code == 2 and f"{ppl}" in result.output and "line 2" in result.output
