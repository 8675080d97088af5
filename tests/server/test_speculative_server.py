"""A server with n-gram speculative decoding: same completions as plain decoding, streamed
and not, and vLLM-style `spec_decode_*` counters on /metrics."""

from __future__ import annotations

import json

import httpx
import pytest

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native
from fastgemma.server import ServerThread
from fastgemma.verify.client import parse_spec_decode_counters

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")


def test_speculative_server_matches_plain_and_counts_drafts(tiny_gemma3, helpers):
    spec = LLM(str(tiny_gemma3), dtype="bfloat16", device="cpu", max_model_len=256, speculative="ngram",
               num_speculative_tokens=4, prompt_lookup_min=1)
    plain = LLM(str(tiny_gemma3), dtype="bfloat16", device="cpu", max_model_len=256)
    prompt = [9, 4] * 6
    expected = plain.generate([prompt], SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))[0].outputs[0]
    with ServerThread(spec, served_model_name="tiny-spec") as server, httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"model": "tiny-spec", "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200
        assert r.json()["choices"][0]["token_ids"] == expected.token_ids
        assert r.json()["choices"][0]["text"] == expected.text
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == expected.text
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        counters = parse_spec_decode_counters(c.get("/metrics").text)
        assert counters is not None and counters["num_drafts"] > 0
        assert 0 < counters["num_accepted_tokens"] <= counters["num_draft_tokens"]
        assert helpers.metric(c, "fastgemma:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0


def test_parse_spec_decode_counters_reads_vllm_and_ours():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total x",
        'vllm:spec_decode_num_drafts_total{model_name="m"} 4.0',
        'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 4.0',
    ])
    assert parse_spec_decode_counters(text) == {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 9.0}
    assert parse_spec_decode_counters("fastgemma:generation_tokens_total 3.0") is None
