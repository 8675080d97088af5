"""verify/verdict.py: VERIFIED only when every rule holds; each failure and gap gives a reason."""

from __future__ import annotations

from fastgemma.verify.audit import Captured
from fastgemma.verify.identity import compare
from fastgemma.verify.tps import TpsRequest, TpsResult
from fastgemma.verify.verdict import decide


def _tps(stage: str, tokens_per_s: float, n: int = 4, output_len: int = 64, short: int = 0) -> TpsResult:
    reqs = [TpsRequest(i, f"k{i}", 10, output_len - (1 if i < short else 0), 1.0, 0.1) for i in range(n)]
    duration = sum(r.completion_tokens for r in reqs) / tokens_per_s
    return TpsResult(stage, output_len, duration, reqs)


HOLDS = compare([Captured("a", [1], [4, 5], 0.1)], {"a": [4, 5]}, "test")
DIVERGES = compare([Captured("a", [1], [4, 5], 0.1)], {"a": [4, 6]}, "test")
UNKNOWN = compare([Captured("a", [1], [4, 5], 0.1)], {}, "none")


def test_verified():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 96.0), 2.30, 2.42, HOLDS)
    assert v.status == "VERIFIED" and v.reasons == []


def test_tps_outside_five_percent():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 94.0), 2.30, 2.42, HOLDS)
    assert v.status == "INVALID"
    assert len(v.reasons) == 1 and "tps re-run" in v.reasons[0] and "-6.0%" in v.reasons[0]
    assert decide(_tps("tps", 100.0), _tps("tps-private", 105.9), 2.30, 2.42, HOLDS).status == "INVALID"
    assert decide(_tps("tps", 100.0), _tps("tps-private", 104.9), 2.30, 2.42, HOLDS).status == "VERIFIED"


def test_ppl_over_cap():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 100.0), 2.43, 2.42, HOLDS)
    assert v.status == "INVALID" and "ppl cap" in v.reasons[0] and "> cap" in v.reasons[0]


def test_private_ppl_over_cap():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 100.0), 2.3, 2.42, HOLDS, private_ppl=2.6, private_cap=2.5)
    assert v.status == "INVALID" and v.reasons[0].startswith("private ppl cap")


def test_identity_divergence_and_pending():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 100.0), 2.3, 2.42, DIVERGES)
    assert v.status == "INVALID" and "a at token 1" in v.reasons[0]
    v = decide(_tps("tps", 100.0), _tps("tps-private", 100.0), 2.3, None, UNKNOWN)
    assert v.status == "PENDING" and len(v.reasons) == 2  # no PPL reference, no greedy reference


def test_failure_outranks_pending():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 80.0), 2.3, None, UNKNOWN)
    assert v.status == "INVALID" and len(v.reasons) == 3


def test_short_outputs_are_invalid():
    v = decide(_tps("tps", 100.0, short=1), _tps("tps-private", 100.0), 2.3, 2.42, HOLDS)
    assert v.status == "INVALID" and "1 of 8 requests did not return 64 tokens" in v.reasons[0]


def test_a_quick_run_reports_the_tps_change_without_judging_it():
    v = decide(_tps("tps", 100.0), _tps("tps-private", 74.0), 2.30, 2.42, HOLDS, quick=True)
    assert v.status == "VERIFIED" and v.reasons == []
    assert v.checks[0].status == "info" and "-26.0%; not judged in a quick run" in v.checks[0].detail
    assert decide(_tps("tps", 100.0), _tps("tps-private", 74.0), 2.43, 2.42, HOLDS, quick=True).status == "INVALID"  # PPL still judged
    assert decide(_tps("tps", 100.0), _tps("tps-private", 88.0), 2.30, 2.42, HOLDS).status == "INVALID"
