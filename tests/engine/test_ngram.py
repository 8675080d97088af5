"""n-gram drafting: the most recent earlier occurrence of the longest matching suffix."""

from __future__ import annotations

from fastgemma.engine.ngram import NgramProposer


def test_proposes_what_followed_the_most_recent_match():
    p = NgramProposer(k=3, prompt_lookup_min=2, prompt_lookup_max=3)
    #          0  1  2  3  4  5  6  7  8  9
    ids = [5, 6, 7, 1, 5, 6, 7, 2, 9, 5, 6, 7]
    assert p.propose(ids) == [2, 9, 5]  # the match at 4..6 (most recent), not the one at 0..2


def test_longest_suffix_first_then_shorter():
    p = NgramProposer(k=2, prompt_lookup_min=1, prompt_lookup_max=3)
    assert p.propose([1, 2, 3, 8, 2, 3, 9, 4, 3]) == [9, 4]  # [9, 4, 3], [4, 3] never seen; [3] last at 5
    assert p.propose([7, 7, 7]) == [7]  # the continuation is cut at the sequence's end
    assert p.propose([1, 2, 3, 4]) == []  # nothing repeats


def test_limit_and_short_inputs():
    p = NgramProposer(k=4, prompt_lookup_min=2, prompt_lookup_max=2)
    ids = [1, 2, 3, 4, 5, 6, 1, 2]
    assert p.propose(ids) == [3, 4, 5, 6]
    assert p.propose(ids, limit=2) == [3, 4]
    assert p.propose(ids, limit=0) == []
    assert p.propose([1, 2]) == []
