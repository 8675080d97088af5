"""The verdict: VERIFIED, INVALID or PENDING, with one check per rule and its reason.

Rules (the challenge's verification):
- tps re-run: the private re-run's TPS within ±5% of the public TPS. A `--quick` run reports
  the change but does not judge it ("info"): four 64-token requests per side moved by up to
  26% run to run on a quiet 2-core VM, so no tolerance would mean anything; the challenge's
  ±5% is judged on a full run;
- ppl cap: PPL <= cap = reference PPL × 1.05 (also for the private PPL data when given);
- greedy identity: served greedy ids equal plain greedy decoding on every audited prompt;
- output length: every timed request emitted exactly output len tokens (ignore_eos held),
  otherwise TPS counts a different amount of work.
INVALID when any check fails; else PENDING when any cannot be judged (no reference); else
VERIFIED. Knows nothing about HTTP or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastgemma.verify.identity import IdentityResult
from fastgemma.verify.tps import TpsResult

TPS_TOLERANCE = 0.05
PPL_CAP_FACTOR = 1.05
PASS, FAIL, PENDING, INFO = "pass", "fail", "pending", "info"  # info: reported, not judged


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | fail | pending
    detail: str


@dataclass(frozen=True)
class Verdict:
    checks: list[Check]

    @property
    def status(self) -> str:
        states = {c.status for c in self.checks}
        return "INVALID" if FAIL in states else "PENDING" if PENDING in states else "VERIFIED"

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status not in (PASS, INFO)]

    def to_dict(self) -> dict[str, object]:
        return {"verdict": self.status, "reasons": self.reasons,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def tps_check(public: TpsResult, private: TpsResult, quick: bool = False) -> Check:
    change = private.output_tps / public.output_tps - 1.0
    detail = f"private {private.output_tps:.2f} vs public {public.output_tps:.2f} tok/s ({100 * change:+.1f}%"
    if quick:
        return Check("tps re-run", INFO, detail + "; not judged in a quick run: a full run is held to ±5%)")
    return Check("tps re-run", PASS if abs(change) <= TPS_TOLERANCE else FAIL, detail + f", limit ±{100 * TPS_TOLERANCE:g}%)")


def ppl_check(name: str, ppl: float, cap: float | None) -> Check:
    if cap is None:
        return Check(name, PENDING, f"PPL {ppl:.4f}; no reference PPL (give --reference-ppl, or --model to measure it)")
    return Check(name, PASS if ppl <= cap else FAIL, f"PPL {ppl:.4f} {'<=' if ppl <= cap else '>'} cap {cap:.4f}")


def identity_check(identity: IdentityResult) -> Check:
    holds = identity.holds
    if holds is False:
        first = ", ".join(f"{p.key} at token {p.first_divergence}" for p in identity.diverged[:3])
        return Check("greedy identity", FAIL, f"{len(identity.diverged)} of {len(identity.prompts)} prompts diverge ({first})")
    if holds is None:
        why = f"no reference output for {len(identity.missing)} prompts" if identity.missing else "no prompts audited"
        return Check("greedy identity", PENDING, f"{why} (give --reference-outputs, or --model to decode them)")
    return Check("greedy identity", PASS, f"{len(identity.prompts)} prompts identical ({identity.source})")


def length_check(runs: list[TpsResult]) -> Check:
    off = [r for run in runs for r in run.off_length]
    total = sum(len(run.requests) for run in runs)
    if off:
        return Check("output length", FAIL, f"{len(off)} of {total} requests did not return {runs[0].output_len} tokens (ignore_eos not honoured?)")
    return Check("output length", PASS, f"all {total} requests returned {runs[0].output_len} tokens")


def decide(public: TpsResult, private: TpsResult, ppl: float, cap: float | None, identity: IdentityResult,
           private_ppl: float | None = None, private_cap: float | None = None, quick: bool = False) -> Verdict:
    checks = [tps_check(public, private, quick), ppl_check("ppl cap", ppl, cap)]
    if private_ppl is not None:
        checks.append(ppl_check("private ppl cap", private_ppl, private_cap))
    checks += [identity_check(identity), length_check([public, private])]
    return Verdict(checks)
