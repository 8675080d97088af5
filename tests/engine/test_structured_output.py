"""Structured outputs: constrained greedy decoding is the plain path's masked argmax, step by step.

The reference is independent of the engine's grammar plumbing: the plain configuration
(full lm_head, no drafter, no fused step) run one token at a time through `ModelRunner`, its
logits masked with a separate llguidance matcher's bitmask, argmax taken here. The engine
under test runs with the lm_head screen, n-gram speculation and batching beside
unconstrained requests; every step must agree.
"""

from __future__ import annotations

import json

import pytest
import torch

from fastgemma import LLM, SamplingParams, StructuredOutputsParams
from fastgemma.config import EngineConfig
from fastgemma.engine.structured_output import GrammarCompiler
from fastgemma.kernels.lm_head_screen import masked, unpack_bitmask

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(json_object=True),
    StructuredOutputsParams(regex=r"(yes|no), because [a-z ]{1,30}\."),
    StructuredOutputsParams(choice=["Paris", "London", "Lisbon"]),
    StructuredOutputsParams(grammar='start: "x=" NUM ("+" NUM)*\nNUM: /[0-9]{1,3}/'),
]
PROMPTS = ["The person, as JSON:", "Is the sky blue? Answer:", "x=1+2"]
CONFIGS = {
    "screen": dict(dtype="bfloat16"),
    "screen + ngram": dict(dtype="bfloat16", speculative="ngram", num_speculative_tokens=4, prompt_lookup_min=1),
    "no screen": dict(dtype="bfloat16", lm_head_screen=False),
    "fp32 + ngram": dict(dtype="float32", speculative="ngram", num_speculative_tokens=3, prompt_lookup_min=1),
}


@pytest.fixture(scope="module")
def plain(tiny_text_model):
    """The plain path of the tiny model (bf16 and fp32)."""
    return {
        dtype: LLM.from_config(EngineConfig(model=str(tiny_text_model), dtype=dtype, max_model_len=256).plain())
        for dtype in ("bfloat16", "float32")
    }


def masked_greedy_reference(llm: LLM, compiler: GrammarCompiler, prompt_ids, constraint, n: int) -> list[int]:
    """Plain decoding one token at a time, each step's logits masked by the grammar's bitmask."""
    matcher = compiler.compile(constraint)
    runner, out = llm.runner, []
    logits = runner.prefill(prompt_ids)
    position = len(prompt_ids)
    for _ in range(n):
        token = int(torch.argmax(masked(logits, matcher.bitmask())))
        out.append(token)
        matcher.accept(token)
        if matcher.is_terminated or token in llm.spec.eos_token_ids:
            break
        logits = runner.decode(token, position)
        position += 1
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_constrained_greedy_is_the_plain_paths_masked_argmax(tiny_text_model, plain, config):
    options = CONFIGS[config]
    llm = LLM(str(tiny_text_model), max_model_len=256, max_num_seqs=4, **options)
    reference = plain[options["dtype"]]
    compiler = llm.engine.grammars
    for prompt in PROMPTS:
        ids = llm.encode_prompt(prompt)
        # every constraint at once, batched beside an unconstrained request
        params = [SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=c) for c in CONSTRAINTS]
        seqs = [llm.engine.add_request(ids, p) for p in params]
        free = llm.engine.add_request(ids, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        while llm.engine.has_unfinished():
            llm.engine.step()
        for constraint, seq in zip(CONSTRAINTS, seqs):
            want = masked_greedy_reference(reference, compiler, ids, constraint, 40)
            assert seq.output_token_ids == want, (config, prompt, constraint.kind)
        alone = llm.generate([ids], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
        assert free.output_token_ids == alone.outputs[0].token_ids


def test_outputs_follow_their_grammar(tiny_text_model):
    """Complete outputs parse / match (the random model's preferences are not the grammar's)."""
    import re

    llm = LLM(str(tiny_text_model), max_model_len=512)
    cases = [
        (StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
         lambda t: set(json.loads(t)) == {"name", "age", "tags"}),
        (StructuredOutputsParams(regex=r"(yes|no), because [a-z ]{1,30}\."),
         lambda t: re.fullmatch(r"(yes|no), because [a-z ]{1,30}\.", t) is not None),
        (StructuredOutputsParams(choice=["Paris", "London"]), lambda t: t in ("Paris", "London")),
    ]
    for constraint, ok in cases:
        for seed in range(3):
            out = llm.generate(["Answer:"], SamplingParams(max_tokens=200, temperature=1.0, seed=seed,
                                                          structured_outputs=constraint))[0].outputs[0]
            assert out.finish_reason == "stop" and ok(out.text), (constraint.kind, out.text)


def test_sampling_draws_only_allowed_tokens_from_the_renormalised_distribution(tiny_text_model):
    """The first sampled token under a choice constraint: its frequencies follow the model's
    probabilities over the allowed first tokens, renormalised."""
    llm = LLM(str(tiny_text_model), dtype="float32", max_model_len=128)
    constraint = StructuredOutputsParams(choice=["a", "b", "c"])
    ids = llm.encode_prompt("Pick:")
    logits = llm.runner.prefill(ids)
    allowed = unpack_bitmask(llm.engine.grammars.compile(constraint).bitmask(), logits.shape[-1])
    assert int(allowed.sum()) >= 3
    p = torch.softmax(masked(logits, llm.engine.grammars.compile(constraint).bitmask()).float(), -1)
    n, counts = 600, {}
    for seed in range(n):
        out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=1.0, seed=seed,
                                                 structured_outputs=constraint))[0].outputs[0]
        t = out.token_ids[0]
        assert allowed[t]
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        assert abs(c / n - float(p[t])) < 4 * (float(p[t]) * (1 - float(p[t])) / n) ** 0.5 + 0.01, (t, c, float(p[t]))


def test_bad_constraints_name_their_field(tiny_text_model):
    llm = LLM(str(tiny_text_model), max_model_len=128)
    bad = [
        (dict(regex="a(b"), "structured_outputs.regex"),
        (dict(json={"type": "frobnicate"}), "structured_outputs.json"),
        (dict(json="{not json"), "structured_outputs.json"),
        (dict(grammar="start: undefined_rule"), "structured_outputs.grammar"),
        (dict(choice=[]), "structured_outputs"),
    ]
    for fields, name in bad:
        with pytest.raises(ValueError, match=name):
            llm.engine.add_request([2, 100], SamplingParams(structured_outputs=StructuredOutputsParams(**fields)))
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(regex="a", choice=["a"])
    assert not llm.engine.has_unfinished()
