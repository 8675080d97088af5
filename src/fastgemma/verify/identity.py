"""Stage identity: served greedy ids against plain greedy decoding of the same checkpoint.

The rule (the challenge's): the served greedy output must be token-identical to plain greedy
autoregressive decoding on the same prompt tokens. Per prompt we report whether it holds and
the first divergent position (0-based, in the generated tokens; a shorter sequence that is a
prefix of the other diverges at its length). Prompts without a reference are listed, not
judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastgemma.verify.audit import Captured


def first_divergence(served: list[int], reference: list[int]) -> int | None:
    """The first index where the sequences differ (or the shorter one ends); None if equal."""
    for i, (a, b) in enumerate(zip(served, reference)):
        if a != b:
            return i
    return None if len(served) == len(reference) else min(len(served), len(reference))


@dataclass(frozen=True)
class PromptIdentity:
    key: str
    first_divergence: int | None  # None: identical
    served_len: int
    reference_len: int

    @property
    def identical(self) -> bool:
        return self.first_divergence is None


@dataclass(frozen=True)
class IdentityResult:
    source: str  # where the reference came from
    prompts: list[PromptIdentity] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # captured keys with no reference

    @property
    def holds(self) -> bool | None:
        """False on any divergence; None when nothing could be judged or references are missing."""
        if any(not p.identical for p in self.prompts):
            return False
        if self.missing or not self.prompts:
            return None
        return True

    @property
    def diverged(self) -> list[PromptIdentity]:
        return [p for p in self.prompts if not p.identical]

    def to_dict(self) -> dict[str, object]:
        return {
            "holds": self.holds, "source": self.source, "num_prompts": len(self.prompts),
            "num_identical": sum(p.identical for p in self.prompts), "missing_references": self.missing,
            "prompts": [
                {"id": p.key, "identical": p.identical, "first_divergence": p.first_divergence,
                 "served_len": p.served_len, "reference_len": p.reference_len}
                for p in self.prompts
            ],
        }


def compare(captured: list[Captured], reference: dict[str, list[int]], source: str) -> IdentityResult:
    prompts, missing = [], []
    for c in captured:
        ref = reference.get(c.key)
        if ref is None:
            missing.append(c.key)
            continue
        prompts.append(PromptIdentity(c.key, first_divergence(c.token_ids, ref), len(c.token_ids), len(ref)))
    return IdentityResult(source, prompts, missing)

