"""Per-request generation settings, named and defaulted as vLLM's `SamplingParams`.

Validated once at construction: a bad value raises `ValueError` saying what to change.
`n` > 1 asks for several completions of one prompt (choices): the engine runs them as
sequences sharing the prompt's computed cache (engine/llm_engine.py), each with
`for_choice(i)`'s settings, vLLM's: n = 1 and, when seeded, seed + i.

Logits processing, vLLM's fields and meanings (engine/sampler.py `process_logits`): the
penalties over the tokens generated so far (presence, frequency) and over the prompt's and
the generated tokens (repetition), `logit_bias`; `min_p` filters the sampling distribution
(greedy is unaffected); `min_tokens` keeps the stop ids' logits at -inf until that many
tokens are out (and stop strings unchecked). A request with penalties or a bias reads
processed logits each step (`processes_logits`), one with min_tokens until it has them; a
greedy one still takes the lm_head screen in decode steps (engine/llm_engine.py), its first
token reads the full logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastgemma.engine.structured_output import StructuredOutputsParams

SAMPLING_EPS = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS): no overflow, no NaN


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions (choices) of the prompt
    max_tokens: int = 16  # tokens to generate at most (vLLM's default)
    min_tokens: int = 0  # tokens before end-of-sequence, stop_token_ids or a stop string may end it
    temperature: float = 1.0  # 0 (or under SAMPLING_EPS) = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = all
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one, in [0, 1]
    presence_penalty: float = 0.0  # subtracted from the logit of every token generated so far, in [-2, 2]
    frequency_penalty: float = 0.0  # subtracted once per time a token was generated, in [-2, 2]
    repetition_penalty: float = 1.0  # a prompt or generated token's logit / it (> 0) or x it (<= 0), in [0.01, 100]
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    seed: int | None = None  # per-request RNG seed: same seed, same samples
    stop: list[str] = field(default_factory=list)  # stop strings, excluded from the text
    stop_token_ids: list[int] = field(default_factory=list)  # extra ids that end generation
    ignore_eos: bool = False  # keep generating past end-of-sequence ids
    logprobs: int | None = None  # return the top-n logprobs of each generated token
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the output must follow

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", [self.stop])
        def number(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not number(getattr(self, name)):
                raise ValueError(f"{name} must be a number (got {getattr(self, name)!r})")
        checks = [  # (field, its value is fine, what it must be)
            ("n", isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1, "an integer >= 1"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "an integer >= 1"),
            ("min_tokens", isinstance(self.min_tokens, int) and not isinstance(self.min_tokens, bool)
             and 0 <= self.min_tokens <= self.max_tokens, "an integer in [0, max_tokens]"),
            ("temperature", 0.0 <= self.temperature <= 100.0, "in [0, 100] (0 = greedy)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "-1, 0 (disabled) or a positive integer"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            ("repetition_penalty", 0.01 <= self.repetition_penalty <= 100.0, "in [0.01, 100] (1 = none)"),
            ("logit_bias", self.logit_bias is None or (isinstance(self.logit_bias, dict) and all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 0 and number(v) and -100.0 <= v <= 100.0
                for k, v in self.logit_bias.items())), "a dict of token ids to biases in [-100, 100]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "between 0 and 20"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "a list of non-empty strings"),
            ("seed", self.seed is None or isinstance(self.seed, int), "an integer"),
            ("structured_outputs", self.structured_outputs is None
             or isinstance(self.structured_outputs, StructuredOutputsParams), "a StructuredOutputsParams"),
        ]
        for name, ok, must in checks:
            if not ok:
                raise ValueError(f"{name} must be {must} (got {getattr(self, name)!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def processes_logits(self) -> bool:
        """Penalties or a bias change the logits before the pick (module docstring)."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
                or bool(self.logit_bias))

    def processes_logits_at(self, num_output_tokens: int) -> bool:
        """Whether the pick of output token `num_output_tokens` (0-based) reads processed logits."""
        return self.processes_logits or num_output_tokens < self.min_tokens

    def for_choice(self, index: int) -> SamplingParams:
        """Choice `index`'s own settings (vLLM's parallel sampling): n = 1, seed + index when
        seeded, so choice i draws what a request with that seed alone would."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)
