"""The exact requests of the challenge harness: perplexity, output audit, serving benchmark."""

from __future__ import annotations

import pytest

from fastgemma import SamplingParams


def test_ppl_request_prompt_logprobs_equal_in_process(client, ref_llm):
    ids = ref_llm.tokenizer.encode("Perplexity is the exponent of the average negative log-likelihood.", add_special_tokens=True)
    ids = ids + [1000 + 37 * i for i in range(40)]  # arbitrary ids too: the harness sends token ids
    body = {
        "model": "tiny-gemma",
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": False,
        "prompt_logprobs": 1,
        "add_special_tokens": False,
        "return_token_ids": True,
    }
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and out["model"] == "tiny-gemma"
    choice = out["choices"][0]
    assert set(choice) >= {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs", "token_ids", "prompt_token_ids"}
    assert choice["prompt_token_ids"] == ids
    assert len(choice["token_ids"]) == 1
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}

    plp = choice["prompt_logprobs"]
    ref = ref_llm.prompt_logprobs(ids, top=1)
    assert len(plp) == len(ids) and plp[0] is None
    for pos in range(1, len(ids)):
        entry, expected = plp[pos], ref[pos]
        actual = str(ids[pos])
        assert actual in entry, f"position {pos}: the prompt token is missing"
        assert entry[actual]["logprob"] == pytest.approx(expected.logprob, abs=1e-5)
        assert entry[actual]["rank"] == expected.rank
        assert entry[actual]["decoded_token"] == ref_llm.tokenizer.token_text(ids[pos])
        top_id, top_lp = expected.top[0]
        assert entry[str(top_id)]["rank"] == 1
        assert entry[str(top_id)]["logprob"] == pytest.approx(top_lp, abs=1e-5)
        assert len(entry) == (1 if top_id == ids[pos] else 2)
        assert set(entry[actual]) == {"logprob", "rank", "decoded_token"}

    # The generated token is greedy from the whole prompt.
    gen = ref_llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert choice["token_ids"] == gen.token_ids


def test_audit_request_512_greedy_ids(client, ref_llm):
    ids = ref_llm.tokenizer.encode("Write an essay about the ocean.", add_special_tokens=True)
    body = {
        "model": "tiny-gemma",
        "prompt": ids,
        "max_tokens": 512,
        "temperature": 0.0,
        "ignore_eos": True,
        "add_special_tokens": False,
        "return_token_ids": True,
    }
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ref = ref_llm.generate([ids], SamplingParams(max_tokens=512, temperature=0.0, ignore_eos=True))[0]
    assert len(choice["token_ids"]) == 512
    assert choice["token_ids"] == ref.token_ids
    assert choice["text"] == ref.text
    assert choice["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 512


def test_benchmark_chat_request_with_extra_fields(client, ref_llm):
    """sglang bench_serving (backend vllm-chat): one user message, max_tokens, ignore_eos, extras."""
    body = {
        "model": "tiny-gemma",
        "messages": [{"role": "user", "content": "Summarise the plot of Hamlet."}],
        "max_tokens": 24,
        "max_completion_tokens": 24,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": False,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "some_unknown_field": {"nested": [1, 2]},
        "lora_path": None,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    ids = ref_llm.chat_prompt_ids(body["messages"])
    ref = ref_llm.generate([ids], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": ref.text}
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 24, "total_tokens": len(ids) + 24}
