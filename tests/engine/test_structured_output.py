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


def test_structural_tags_constrain_only_what_follows_a_trigger(tiny_text_model):
    """vLLM's structural_tag: free text, and after a trigger the structure's begin, a JSON
    value following its schema, and its end."""
    llm = LLM(str(tiny_text_model), max_model_len=128)
    tag = {"structures": [{"begin": "<fn=get>", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                           "required": ["n"], "additionalProperties": False},
                           "end": "</fn>"}],
           "triggers": ["<fn="]}
    compiler = llm.engine.grammars

    def accepted(text: str) -> bool:
        ids = llm.tokenizer.encode(text, add_special_tokens=False)
        return compiler.compile(StructuredOutputsParams(structural_tag=json.dumps(tag))).matcher.validate_tokens(ids) == len(ids)

    assert accepted('Some free text, then <fn=get>{"n": 3}</fn> and more text')
    assert not accepted('Text <fn=get>{"m": 3}</fn>')
    assert not accepted("Text <fn=other>")
    with pytest.raises(ValueError, match="structured_outputs.structural_tag"):
        compiler.compile(StructuredOutputsParams(structural_tag={"structures": [{"begin": "x"}]}))


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


class _ByteVocab:
    """A 512-token vocabulary for the tiny Gemma 4 models (no Hugging Face tokenizer): ids
    0-255 are single bytes, 256-511 the text "<id>"; id 1 ends a sequence."""

    eos_token_id, bos_token_id, special_token_ids = 1, 2, [0, 1, 2]
    tokens = [bytes([i]) for i in range(256)] + [f"<{i}>".encode() for i in range(256, 512)]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@pytest.fixture(scope="module")
def mtp_models(tiny_e4b, tmp_path_factory):
    from tests import tiny_models

    config = tiny_models.gemma4_assistant_config(tiny_models.gemma4_e4b_like_config())
    return tiny_e4b, tiny_models.save_tiny_assistant(config, tmp_path_factory.mktemp("assistant"), seed=11)


@pytest.mark.parametrize("speculative", ["mtp", "ngram"])
def test_speculative_constrained_greedy_equals_non_speculative(mtp_models, speculative):
    """Gemma 4 (tiny E4B-like) with the MTP drafter or n-gram drafts under a grammar that
    excludes some tokens: drafts are cut to what it accepts, rows are masked, the matcher
    rolls back; the output equals non-speculative constrained greedy."""
    from llguidance import LLTokenizer, TokenizerWrapper

    target, assistant = mtp_models
    vocab = LLTokenizer(TokenizerWrapper(_ByteVocab()), n_vocab=512)
    constraints = [StructuredOutputsParams(regex=r"[^\x10-\x3f]{20,60}"),
                   StructuredOutputsParams(regex=r"([a-z<>0-9]{1,6} ){4,12}")]
    prompts = [[5, 6, 7, 8] * 3, list(range(70, 100)), [300, 301, 302] * 5]
    extra = (dict(draft_model=str(assistant), num_speculative_tokens=4) if speculative == "mtp"
             else dict(num_speculative_tokens=4, prompt_lookup_min=1))
    plain = LLM(str(target), dtype="float32", max_model_len=128)
    spec = LLM(str(target), dtype="float32", max_model_len=128, speculative=speculative, **extra)
    for llm in (plain, spec):
        llm.engine.grammars = GrammarCompiler(None, 512, llm.spec.eos_token_ids, tokenizer=vocab)
    for constraint in constraints:
        params = SamplingParams(max_tokens=50, temperature=0.0, structured_outputs=constraint)
        want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
        assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
        for tokens in want:  # the grammar shaped them: no excluded byte
            assert all(not 0x10 <= t <= 0x3F for t in tokens) or constraint.regex.startswith("(")
    stats = spec.engine.spec_stats
    assert stats.num_drafts > 0  # drafts got through the grammar (a random assistant's are rarely kept)
    if speculative == "ngram":
        assert stats.num_accepted_tokens > 0


def test_the_fixed_shape_step_masks_its_greedy_rows(tiny_gemma3):
    """CUDA's fixed-shape step (run eagerly on CPU) picks greedy tokens inside its graph; a
    constrained row takes the step's logits and the masked argmax instead: the same tokens
    as the per-op path under the same grammar."""
    from llguidance import LLTokenizer, TokenizerWrapper

    from fastgemma.engine.llm_engine import LLMEngine
    from fastgemma.engine.model_runner import ModelRunner

    llm = LLM(str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=128, kernels="torch")
    vocab = LLTokenizer(TokenizerWrapper(_ByteVocab()), n_vocab=512)

    def engine(static: bool) -> LLMEngine:
        runner = ModelRunner(llm.model, 128, prefill_chunk=16, static_steps=static, enforce_eager=True, max_num_seqs=2)
        grammars = GrammarCompiler(None, 512, llm.spec.eos_token_ids, tokenizer=vocab)
        return LLMEngine(runner, llm.spec.eos_token_ids, llm.spec.vocab_size, grammars=grammars)

    params = SamplingParams(max_tokens=40, temperature=0.0,
                            structured_outputs=StructuredOutputsParams(regex=r"[a-z]{3,8}( [a-z]{3,8}){2,6}"))
    outputs = []
    for static in (False, True):
        e = engine(static)
        seqs = [e.add_request(p, params) for p in ([5, 6, 7], [300, 12, 40, 41])]
        while e.has_unfinished():
            e.step()
        outputs.append([s.output_token_ids for s in seqs])
        assert all(t in range(ord("a"), ord("z") + 1) or t == ord(" ") or t == 1 for s in seqs for t in s.output_token_ids)
    assert outputs[0] == outputs[1]
