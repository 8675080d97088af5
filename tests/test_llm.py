"""The Python API: vLLM's names and shapes, validation, stop strings, seeded sampling."""

from __future__ import annotations

import pytest

from fastgemma import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_gemma3) -> LLM:
    return LLM(str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=64)


def test_generate_token_ids_shape(tiny):
    outs = tiny.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert len(outs) == 2
    for out in outs:
        assert len(out.token_ids) == 5 and out.outputs[0].token_ids == out.token_ids
        assert out.text == ""  # no tokenizer files in the tiny folder
        assert out.outputs[0].finish_reason == "length"
    assert outs[0].prompt_token_ids == [1, 2, 3]


def test_greedy_is_deterministic_and_plain(tiny):
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    a = tiny.generate([[7, 8, 9]], p)[0].token_ids
    assert tiny.generate([[7, 8, 9]], p)[0].token_ids == a
    # The same tokens by hand: prefill then one decode per step, argmax each time.
    import torch

    ids = [7, 8, 9]
    logits = tiny.runner.prefill(ids)
    manual = []
    for _ in range(12):
        manual.append(int(torch.argmax(logits)))
        logits = tiny.runner.decode(manual[-1], len(ids) + len(manual) - 1)
    assert manual == a


def test_seeded_sampling_repeats(tiny):
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=123, ignore_eos=True)
    a = tiny.generate([[1, 2]], p)[0].token_ids
    assert tiny.generate([[1, 2]], p)[0].token_ids == a
    other = SamplingParams(max_tokens=10, temperature=1.0, seed=124, ignore_eos=True)
    assert any(tiny.generate([[1, 2]], other)[0].token_ids != a for _ in range(3))


def test_n_choices_are_the_requests_of_their_seeds_and_stream_refuses_them(tiny):
    """vLLM's parallel sampling: choice i of a seeded request is the request with seed + i."""
    p = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=40, ignore_eos=True)
    outs = tiny.generate([[1, 2], [3, 4, 5]], p)
    assert [len(o.outputs) for o in outs] == [3, 3] and [c.index for c in outs[1].outputs] == [0, 1, 2]
    for prompt, out in zip([[1, 2], [3, 4, 5]], outs):
        alone = [tiny.generate([prompt], p.for_choice(i))[0].token_ids for i in range(3)]
        assert [c.token_ids for c in out.outputs] == alone and alone[0] != alone[1]
    assert p.for_choice(2).seed == 42 and p.for_choice(2).n == 1
    with pytest.raises(ValueError, match="a stream yields one choice"):
        next(tiny.stream([1, 2], p))


def test_score_first_entry_none(tiny):
    lps = tiny.score([3, 4, 5, 6])
    assert lps[0] is None and len(lps) == 4 and all(lp <= 0 for lp in lps[1:])


def test_eos_stops_unless_ignored(tiny):
    ids = [5, 6, 7]
    first = tiny.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0].token_ids[0]
    llm_stop = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[first])
    out = tiny.generate([ids], llm_stop)[0]
    assert out.token_ids == [first] and out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(temperature=-0.5), dict(temperature="hot"), dict(top_p=0.0), dict(top_p=1.5),
     dict(top_k=-2), dict(logprobs=99), dict(n=0), dict(n=True)],
)
def test_invalid_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_bad_prompts(tiny):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.generate([[1, 10**6]])
    with pytest.raises(ValueError, match="empty"):
        tiny.generate([[]])
    with pytest.raises(ValueError, match="max_model_len"):
        tiny.generate([list(range(1, 100))])
    with pytest.raises(ValueError, match="tokenizer"):
        tiny.generate(["text needs a tokenizer"])


def test_invalid_dtype(tiny_gemma3):
    with pytest.raises(ValueError, match="dtype"):
        LLM(str(tiny_gemma3), dtype="int3")


def test_max_model_len_caps_generation(tiny):
    out = tiny.generate([list(range(1, 60))], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 64 - 59 and out.outputs[0].finish_reason == "length"


def test_missing_tensor_is_named(tiny_gemma3, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    for f in tiny_gemma3.iterdir():
        shutil.copy(f, tmp_path / f.name)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        LLM(str(tmp_path), dtype="float32")


def test_gemma4_checkpoint_with_unused_shared_kv_weights(tiny_e4b, tmp_path):
    """Google's checkpoints carry k/v weights for KV-shared layers; re-saved ones don't. Both load alike."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    for f in tiny_e4b.iterdir():
        shutil.copy(f, tmp_path / f.name)
    tensors = load_file(tmp_path / "model.safetensors")
    assert not any(k.startswith("model.layers.5.self_attn.k_proj") for k in tensors)  # re-saved: omitted
    for i in (5, 6, 7):  # the shared layers
        for name, shape in (("k_proj", (32, 64)), ("v_proj", (32, 64)), ("k_norm", (16,))):
            tensors[f"model.layers.{i}.self_attn.{name}.weight"] = torch.randn(shape)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    a = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=64)
    b = LLM(str(tmp_path), dtype="float32", device="cpu", max_model_len=64)
    ids = list(range(3, 30))
    assert [e.logprob for e in a.prompt_logprobs(ids)[1:]] == [e.logprob for e in b.prompt_logprobs(ids)[1:]]


def test_interleaved_streams_and_scoring_give_what_each_gets_alone(tiny):
    """Streams consumed in turn share the engine (each one's loop steps it); scoring inside a
    stream's loop works in a cache slot of its own and leaves the stream's tokens unchanged."""
    p = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = [tiny.generate([ids], p)[0].token_ids for ids in ([1, 2, 3], [4, 5])]
    scored_alone = tiny.score([9, 8, 7, 6])
    first, second = tiny.stream([1, 2, 3], p), tiny.stream([4, 5], p)
    got: list[list[int]] = [[], []]
    scored = []
    for a, b in zip(first, second):
        got[0].append(a.token_id)
        got[1].append(b.token_id)
        if len(got[0]) == 3:
            scored = tiny.score([9, 8, 7, 6])
    assert got == alone and scored == scored_alone
    early = tiny.stream([1, 2, 3], p)
    next(early)
    early.close()  # cancels the request; its slot is free again
    assert not tiny.engine.has_unfinished()
    assert tiny.generate([[4, 5]], p)[0].token_ids == alone[1]


