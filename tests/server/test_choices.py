"""`n` choices through the server (vLLM's parallel sampling): completions index choice j of
prompt i as i * n + j, chat as j; each choice is what a request with seed + j gets alone, in
the non-streamed and the streamed response; usage counts the prompt once."""

from __future__ import annotations

import json

import openai

from fastgemma import SamplingParams

MODEL = "tiny-gemma"


def test_completions_n_choices_are_the_requests_of_their_seeds(client, ref_llm):
    prompts = ["One prompt", "and another one"]
    body = {"model": MODEL, "prompt": prompts, "n": 3, "max_tokens": 6, "temperature": 0.9, "seed": 5,
            "ignore_eos": True, "return_token_ids": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == list(range(6))
    params = SamplingParams(n=3, max_tokens=6, temperature=0.9, seed=5, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        for j in range(3):
            want = ref_llm.generate(prompt, params.for_choice(j))[0]
            got = out["choices"][i * 3 + j]
            assert (got["text"], got["token_ids"]) == (want.text, want.token_ids), (i, j)
    assert len({tuple(c["token_ids"]) for c in out["choices"][:3]}) > 1  # the seeds differ
    n_prompt = sum(len(ref_llm.encode_prompt(p)) for p in prompts)
    assert out["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 36, "total_tokens": n_prompt + 36}


def test_chat_n_choices_streamed_equal_the_response(server, client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say things"}], "n": 2, "max_tokens": 8,
            "temperature": 1.0, "seed": 3, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1] and whole["usage"]["completion_tokens"] == 16
    texts, roles, finish = {0: "", 1: ""}, {}, {}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                i, delta = choice["index"], choice["delta"]
                roles.setdefault(i, delta.get("role"))
                texts[i] += delta.get("content") or ""
                finish[i] = choice["finish_reason"] or finish.get(i)
    assert roles == {0: "assistant", 1: "assistant"} and finish == {0: "length", 1: "length"}
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert all(len(c["logprobs"]["content"]) == 8 for c in whole["choices"])
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    again = oai.chat.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"},
                                        extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [texts[0], texts[1]]  # seeded: the same again
