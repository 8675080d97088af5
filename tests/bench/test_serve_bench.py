"""`fastgemma bench serve` end to end on a tiny model: it starts `fastgemma serve`, measures
each concurrency with streamed requests, reports every figure, and stops the server."""

from __future__ import annotations

from fastgemma.bench.serve import ServeBenchConfig, run_serve_bench
from fastgemma.config import EngineConfig


def test_bench_serve_measures_every_concurrency(tiny_text_model):
    cfg = ServeBenchConfig(engine=EngineConfig(model=str(tiny_text_model), dtype="float32", max_model_len=1024),
                           concurrency=(1, 3), num_prompts=3, output_len=6, rounds=1)
    result = run_serve_bench(cfg, log=lambda *_: None)
    assert [level["concurrency"] for level in result["levels"]] == [1, 3]
    for level in result["levels"]:
        assert level["requests"] == level["concurrency"] and level["output_tokens"] == 6 * level["requests"]
        assert level["output_tok_s"] > 0 and level["ttft_ms_median"] > 0 and level["itl_ms_p99"] >= level["itl_ms_median"]
    assert result["levels"][0]["vs_first"] == 1.0
