"""verify/identity.py: the first divergent position, planted divergences, missing references."""

from __future__ import annotations

from fastgemma.verify.audit import Captured
from fastgemma.verify.identity import compare, first_divergence


def _captured(key: str, ids: list[int]) -> Captured:
    return Captured(key, [2, 3], ids, 0.1)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([5, 2, 3], [1, 2, 3]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a shorter output diverges where it stops
    assert first_divergence([1, 2, 3, 4], [1, 2, 3]) == 3


def test_planted_divergence_is_found_at_its_position():
    served = [list(range(10 * k, 10 * k + 16)) for k in range(3)]
    reference = {f"p{k}": list(ids) for k, ids in enumerate(served)}
    reference["p1"][11] += 1
    result = compare([_captured(f"p{k}", ids) for k, ids in enumerate(served)], reference, "planted")
    assert result.holds is False
    assert [(p.key, p.first_divergence) for p in result.prompts] == [("p0", None), ("p1", 11), ("p2", None)]
    assert result.to_dict()["num_identical"] == 2


def test_missing_references_are_pending_not_passed():
    result = compare([_captured("a", [1, 2]), _captured("b", [3])], {"a": [1, 2]}, "partial")
    assert result.holds is None and result.missing == ["b"]
    assert compare([_captured("a", [1])], {}, "none").holds is None


def test_divergence_wins_over_missing():
    result = compare([_captured("a", [1, 2]), _captured("b", [3])], {"a": [1, 5]}, "partial")
    assert result.holds is False
