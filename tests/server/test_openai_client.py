"""The official `openai` client against the served tiny model: completions and chat, streamed and not.

Every generated text is checked against the same request run in-process (`ref_llm`).
"""

from __future__ import annotations

import openai
import pytest

from fastgemma import SamplingParams

MODEL = "tiny-gemma"


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def test_models_health_metrics(oai, client):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.get("/health").status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200
    assert "fastgemma:num_requests_waiting" in r.text
    assert "fastgemma:time_to_first_token_seconds" in r.text
    resident = next(line for line in r.text.splitlines() if line.startswith("process_resident_memory_bytes "))
    assert float(resident.split()[1]) > 50 * 2**20  # this process's memory, read from /proc


def test_completion_text_prompt_matches_engine(oai, ref_llm, client, helpers):
    before = helpers.metric(client, "fastgemma:generation_tokens_total")
    out = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    ref = ref_llm.generate("The capital of France is", greedy(12))[0]
    choice = out.choices[0]
    assert out.object == "text_completion"
    assert choice.text == ref.text
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    assert helpers.metric(client, "fastgemma:generation_tokens_total") == before + 12
    assert helpers.metric(client, "fastgemma:requests_total", endpoint="/v1/completions", status="200") >= 1


def test_completion_stream_equals_non_stream(oai, ref_llm):
    prompt = [2, 651, 6037, 529, 9405, 563]
    ref = ref_llm.generate([prompt], greedy(20, ignore_eos=True))[0]
    pieces, ids, reasons = [], [], []
    stream = oai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    for chunk in stream:
        pieces.append(chunk.choices[0].text)
        ids.extend(getattr(chunk.choices[0], "token_ids", None) or [])
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == ref.text
    assert ids == ref.token_ids
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])


def test_completion_echo_and_logprobs(oai, ref_llm):
    out = oai.completions.create(model=MODEL, prompt="Hello world", max_tokens=4, temperature=0, logprobs=2, echo=True)
    ref = ref_llm.generate("Hello world", greedy(4, logprobs=2))[0]
    choice = out.choices[0]
    assert choice.text == "Hello world" + ref.text
    lp = choice.logprobs
    n_prompt = len(ref.prompt_token_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n_prompt + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i, tid in enumerate(ref.token_ids):
        assert lp.token_logprobs[n_prompt + i] == pytest.approx(ref.outputs[0].logprobs[i][tid], abs=1e-4)
        assert 2 <= len(lp.top_logprobs[n_prompt + i]) <= 3
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_matches_engine(oai, ref_llm):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
    ]
    out = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    ids = ref_llm.chat_prompt_ids([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}])
    ref = ref_llm.generate([ids], greedy(10))[0]
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    assert out.choices[0].finish_reason == ref.outputs[0].finish_reason
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == len(ref.token_ids)


def test_chat_stream_with_usage(oai, ref_llm):
    messages = [{"role": "user", "content": "Tell me a story about a dragon."}]
    ids = ref_llm.chat_prompt_ids(messages)
    ref = ref_llm.generate([ids], greedy(16, ignore_eos=True))[0]
    stream = oai.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == ref.text
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == 16


def test_seeded_sampling_is_reproducible(oai, ref_llm):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    a = oai.completions.create(**kw).choices[0].text
    b = oai.completions.create(**kw).choices[0].text
    ref = ref_llm.generate("Once upon a time", SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=7))[0]
    assert a == b == ref.text


def test_stop_string(oai, ref_llm):
    ref = ref_llm.generate("Hi", greedy(12, ignore_eos=True))[0]
    stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 2]
    assert stop.strip(), "the reference text is too short to pick a stop string from"
    cut = ref.text.find(stop)
    out = oai.completions.create(model=MODEL, prompt="Hi", max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].text == ref.text[:cut]
    assert out.choices[0].finish_reason == "stop"


def test_openai_client_errors(oai):
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="not-served", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=-3)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "max_tokens"


def test_batch_of_prompts_runs_sequentially(oai, ref_llm):
    prompts = ["First prompt", "Second, longer prompt here"]
    out = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    for choice, prompt in zip(out.choices, prompts):
        assert choice.text == ref_llm.generate(prompt, greedy(5, ignore_eos=True))[0].text
    assert out.usage.completion_tokens == 10


def test_stream_chunks_are_whole_characters(oai, ref_llm):
    """The random model emits many multi-byte characters; no chunk may carry a broken one."""
    stream = oai.completions.create(model=MODEL, prompt="Emoji:", max_tokens=40, temperature=0, stream=True, extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text for c in stream]
    assert all("\ufffd" not in p for p in pieces)
    text = "".join(pieces)
    assert text == ref_llm.generate("Emoji:", greedy(40, ignore_eos=True))[0].text
    assert any(ord(ch) > 0x7FF for ch in text), "the test needs multi-byte output to mean anything"


def test_penalties_bias_and_min_p_are_the_apis(oai, ref_llm):
    """OpenAI's presence / frequency penalties and logit_bias, vLLM's repetition_penalty,
    min_p and min_tokens: the tokens the Python API gives with the same settings."""
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=10, presence_penalty=0.5, frequency_penalty=0.3,
              logit_bias={"9": 1.5}, seed=3)
    extra = {"repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 4, "ignore_eos": True, "return_token_ids": True}
    for temperature in (0.0, 0.8):
        out = oai.completions.create(**kw, temperature=temperature, extra_body=extra).choices[0]
        params = SamplingParams(max_tokens=10, temperature=temperature, seed=3, presence_penalty=0.5,
                                frequency_penalty=0.3, repetition_penalty=1.2, min_p=0.05, logit_bias={9: 1.5},
                                min_tokens=4, ignore_eos=True)
        ref = ref_llm.generate("Once upon a time", params)[0]
        assert (out.text, out.token_ids) == (ref.text, ref.token_ids), temperature
