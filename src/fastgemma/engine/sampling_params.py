"""Per-request generation settings, named and defaulted as vLLM's `SamplingParams`.

Validated once at construction: a bad value raises `ValueError` saying what to change.
`n` > 1 asks for several completions of one prompt (choices): the engine runs them as
sequences sharing the prompt's computed cache (engine/llm_engine.py), each with
`for_choice(i)`'s settings, vLLM's: n = 1 and, when seeded, seed + i.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastgemma.engine.structured_output import StructuredOutputsParams

SAMPLING_EPS = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS): no overflow, no NaN


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions (choices) of the prompt
    max_tokens: int = 16  # tokens to generate at most (vLLM's default)
    temperature: float = 1.0  # 0 (or under SAMPLING_EPS) = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = all
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

        for name in ("temperature", "top_p"):
            if not number(getattr(self, name)):
                raise ValueError(f"{name} must be a number (got {getattr(self, name)!r})")
        checks = [  # (field, its value is fine, what it must be)
            ("n", isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1, "an integer >= 1"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "an integer >= 1"),
            ("temperature", 0.0 <= self.temperature <= 100.0, "in [0, 100] (0 = greedy)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "-1, 0 (disabled) or a positive integer"),
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

    def for_choice(self, index: int) -> SamplingParams:
        """Choice `index`'s own settings (vLLM's parallel sampling): n = 1, seed + index when
        seeded, so choice i draws what a request with that seed alone would."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)
