"""Prefix caching through the server: a prompt that begins with a kept 512-token chunk skips
it, the answer is the one computing it gives, and /metrics counts the tokens found."""

from __future__ import annotations

from fastgemma import LLM, SamplingParams


def test_a_repeated_long_prompt_hits_the_cache_with_the_same_tokens(client, tiny_text_model, helpers):
    plain = LLM(str(tiny_text_model), dtype="float32", max_num_seqs=1, enable_prefix_caching=False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = [10 + (31 * i) % 5000 for i in range(600)]  # one whole chunk of 512, then 88 tokens
    other = prompt[:550] + [7] * 20  # the same first chunk
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    hits = helpers.metric(client, "fastgemma:prefix_cache_hits_total")
    queries = helpers.metric(client, "fastgemma:prefix_cache_queries_total")
    first = client.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
    second = client.post("/v1/completions", json={**body, "prompt": other}).json()["choices"][0]["token_ids"]
    again = client.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
    assert first == again == plain.generate([prompt], greedy)[0].token_ids
    assert second == plain.generate([other], greedy)[0].token_ids
    assert helpers.metric(client, "fastgemma:prefix_cache_queries_total") - queries == 600 + 570 + 600
    assert helpers.metric(client, "fastgemma:prefix_cache_hits_total") - hits == 2 * 512
