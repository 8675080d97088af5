"""Structured outputs: a grammar per sequence, applied as the set of tokens it allows next.

    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
    compiler.check(params.structured_outputs)              # ValueError naming the field (the server, up front)
    grammar = compiler.compile(params.structured_outputs)  # per sequence (its matcher)
    grammar.bitmask()              -> int32 [W]: the ids allowed next (W = ceil(V / 32); bit
                                      i & 31 of word i >> 5, as llguidance and vLLM lay it out)
    grammar.verification(draft)    -> (the draft's longest prefix the grammar accepts,
                                      int32 [k + 1, W]: the mask before each row of the verification)
    grammar.accept(token)          after each emitted token; `grammar.is_terminated` then
                                   ends the sequence (the grammar is complete and allows nothing more)

How the engine uses it (engine/llm_engine.py): a greedy row picks the best allowed token (the
lm_head screen ranks allowed ids only, kernels/lm_head_screen.py, so it is the plain path's
logits' masked argmax); a sampled row's logits are set to -inf outside the mask before
temperature / top-k / top-p, so the draw is from the allowed distribution renormalised.
With speculation, a draft is cut to the prefix the grammar accepts; the matcher is advanced
through it to get each verification row's mask and rolled back, then advanced by what is kept:
the output equals non-speculative constrained decoding's.

The grammar engine is llguidance (guidance-ai; llama.cpp's and one of vLLM's backends):
no dependencies beyond its own wheel (CPU-only, any Python >= 3.9), the broadest JSON-schema
coverage of the engines measured in JSONSchemaBench, masks computed lazily per step in
tens of microseconds over Gemma's 262k vocabulary (0.02 ms a token on average here,
benchmarks/structured_outputs.py; no grammar compilation pass ahead of time), Lark / GBNF grammars, regexes, and token-level
rollback and draft validation, which speculation needs. xgrammar precompiles per-grammar
token caches (fast masks after a compile that takes longer per schema) and pulls torch,
triton and transformers as dependencies. The tokenizer's llguidance form is built once
per engine, on the first request that needs it (for Gemma's 262k tokens: 4.4 s and 219 MiB
resident, measured by the same benchmark), so engines that never constrain pay nothing.

Request shapes (vLLM's `StructuredOutputsParams`): exactly one of `json` (a JSON schema),
`json_object` (any JSON object), `regex`, `choice` (one of the strings), `grammar` (Lark, or
GBNF as llama.cpp writes it), `structural_tag` (vLLM's {"structures": [{"begin", "schema",
"end"}], "triggers": [...]}: free text in which each trigger starts a structure).
JSON whitespace is bounded between tokens (`JSON_WHITESPACE`, llama.cpp's rule);
`disable_any_whitespace` (vLLM's name) allows none; `disable_additional_properties` forbids
properties the schema does not name.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

from fastgemma.memory import release_free_memory

# Whitespace between JSON tokens as llama.cpp's JSON-schema grammars bound it: nothing, one
# space, or a newline and up to 20 spaces / tabs. Unbounded whitespace (JSON's own rule)
# lets a small model loop on newlines until max_tokens.
JSON_WHITESPACE = r"(?:[ ]?|\n[ \t]{0,20})"
GRAMMAR_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's structured-output constraint of one request: set exactly one kind."""

    json: str | dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    where: str | None = None  # the request field it came from, named in errors (default structured_outputs.<kind>)

    def __post_init__(self) -> None:
        given = [k for k in GRAMMAR_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"{self.where or 'structured_outputs'} takes exactly one of {', '.join(GRAMMAR_KINDS)}; got "
                + (", ".join(given) if given else "none")
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError(f"{self.param}: give a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(k for k in GRAMMAR_KINDS if getattr(self, k) not in (None, False))

    @property
    def param(self) -> str:
        """The request field errors name."""
        return self.where or f"structured_outputs.{self.kind}"

    def to_llguidance(self) -> str:
        """The grammar in llguidance's form (not yet checked: `GrammarCompiler.compile` does)."""
        from llguidance import LLMatcher, StructTag, grammar_from

        kind = self.kind
        if kind in ("json", "json_object"):
            schema = {"type": "object"} if kind == "json_object" else _load_json(self.json, self.param)
            if not isinstance(schema, dict) and not isinstance(schema, bool):
                raise ValueError(f"{self.param}: a JSON schema is an object")
            if self.disable_additional_properties:
                schema = _closed(schema)
            options = {"whitespace_flexible": not self.disable_any_whitespace, "coerce_one_of": True}
            if not self.disable_any_whitespace:
                options["whitespace_pattern"] = JSON_WHITESPACE
            try:
                return LLMatcher.grammar_from_json_schema(schema, defaults=options)
            except ValueError as e:
                raise ValueError(f"{self.param}: not a valid JSON schema: {e}") from None
        if kind == "regex":
            return LLMatcher.grammar_from_regex(self.regex)
        if kind == "choice":
            return grammar_from("choice", self.choice)
        if kind == "grammar":
            try:
                return grammar_from("grammar", self.grammar)
            except ValueError as e:
                raise ValueError(f"{self.param}: {e}") from None
        tag = _load_json(self.structural_tag, self.param)
        try:
            structures, triggers = tag["structures"], tag["triggers"]
            tags = [
                StructTag(
                    trigger=next(t for t in triggers if s["begin"].startswith(t)),
                    begin=s["begin"], grammar=s["schema"], end=s["end"],
                )
                for s in structures
            ]
        except (KeyError, TypeError, StopIteration, AssertionError):
            raise ValueError(
                f'{self.param}: give {{"structures": [{{"begin", "schema", "end"}}], "triggers": [...]}} '
                "with each begin starting with a trigger"
            ) from None
        return StructTag.to_grammar(tags)


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object schema that names its
    properties and says nothing of others (a copy)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    maps = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
    out = {
        k: {n: _closed(s) for n, s in v.items()} if k in maps and isinstance(v, dict) else _closed(v)
        for k, v in schema.items()
    }
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _load_json(value: str | dict | Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None


class GrammarCompiler:
    """Turns a request's constraint into a `Grammar` for one engine's vocabulary. `hf_tokenizer`:
    the model's Hugging Face fast tokenizer; `eos_token_ids`: the ids that end a sequence
    (a complete grammar allows exactly these); `tokenizer`: an llguidance `LLTokenizer`
    already built (for a vocabulary that is not a Hugging Face tokenizer's), else built from
    `hf_tokenizer` on first use."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...], tokenizer: Any = None):
        self.hf, self.vocab_size, self.eos_token_ids = hf_tokenizer, vocab_size, list(eos_token_ids)
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        """llguidance's view of the vocabulary, built on first use (seconds; then cached)."""
        with self._lock:
            if self._tokenizer is None:
                if self.hf is None:
                    raise ValueError("this model folder has no tokenizer files, which structured outputs need")
                import llguidance.hf

                self._tokenizer = llguidance.hf.from_tokenizer(
                    self.hf, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
                release_free_memory()  # the serialised tokenizer it was built from
            return self._tokenizer

    def check(self, params: StructuredOutputsParams) -> None:
        """ValueError naming the request field when the grammar, schema or regex is not valid
        (the server's check, before a request is queued)."""
        from llguidance import LLMatcher

        text = self._convert(params)
        if error := LLMatcher.validate_grammar(text, self.tokenizer):
            raise _invalid(params, error)

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """One sequence's matcher; ValueError as `check` says."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, self._convert(params), log_level=0)
        if matcher.is_error():
            raise _invalid(params, matcher.get_error())
        return Grammar(matcher, self.vocab_size)

    @staticmethod
    def _convert(params: StructuredOutputsParams) -> str:
        try:
            return params.to_llguidance()
        except ValueError:
            raise
        except Exception as e:  # the grammar converters' other complaints about user input
            raise _invalid(params, f"{type(e).__name__}: {e}") from None


def _invalid(params: StructuredOutputsParams, error: str) -> ValueError:
    return ValueError(f"{params.param}: not a valid {params.kind}: {error.strip().splitlines()[0]}")


@dataclass
class Grammar:
    """One sequence's matcher (module docstring)."""

    matcher: Any  # llguidance.LLMatcher
    vocab_size: int

    @property
    def words(self) -> int:
        return (self.vocab_size + 31) // 32

    def bitmask(self) -> torch.Tensor:
        """int32 [W]: the tokens allowed next."""
        out = torch.empty(self.words, dtype=torch.int32)
        self._fill(out)
        return out

    def _fill(self, row: torch.Tensor) -> None:
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if self.matcher.is_error():
            raise RuntimeError(f"structured output grammar failed: {self.matcher.get_error()}")

    def verification(self, draft: list[int]) -> tuple[list[int], torch.Tensor]:
        """(draft cut to the prefix the grammar accepts, masks [len(kept) + 1, W]): row i's
        mask is the one after the first i kept tokens. The matcher ends where it began."""
        kept = draft[: self.matcher.validate_tokens(draft)] if draft else []
        masks = torch.empty(len(kept) + 1, self.words, dtype=torch.int32)
        for i in range(len(kept) + 1):
            self._fill(masks[i])
            if i < len(kept) and not self.matcher.consume_token(kept[i]):
                raise RuntimeError(f"structured output grammar failed: {self.matcher.get_error()}")
        if kept:
            self.matcher.rollback(len(kept))
        return kept, masks

    def accept(self, token_id: int) -> None:
        """Advance past an emitted token (one the mask allowed)."""
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"structured output grammar rejected token {token_id}: {self.matcher.get_error()}")

    @property
    def is_terminated(self) -> bool:
        """Complete: nothing but an end-of-sequence token may follow (or one was taken)."""
        return self.matcher.is_stopped()
