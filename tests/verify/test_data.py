"""verify/data.py and inputs.py: reading the files, the seeded samples, clear errors on bad input."""

from __future__ import annotations

import json
import random

import pytest

from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.data import (
    load_ppl_records,
    load_prompts,
    load_reference_outputs,
    public_and_held_out,
    shuffled,
)
from fastgemma.verify.inputs import load_inputs
from tests.conftest import challenge_file


def test_challenge_files_load():
    prompts = load_prompts(challenge_file("eval_prompts_sharegpt.json"))
    records = load_ppl_records(challenge_file("ppl_ground_truth_tokens.jsonl"))
    assert len(prompts) == 128 and len(records) == 128
    assert all(p.text and not p.key.startswith("index:") for p in prompts)
    assert {p.key for p in prompts} == {r.key for r in records}  # the audit relies on shared ids


def test_order_is_bench_serving_shuffle():
    prompts = load_prompts(challenge_file("eval_prompts_sharegpt.json"))
    items = list(prompts)
    random.seed(1)
    random.shuffle(items)  # what bench_serving does after `random.seed(args.seed)`
    assert shuffled(prompts, 1) == items
    assert shuffled(prompts, 2) != items


def test_held_out_split_is_disjoint_and_seeded():
    prompts = load_prompts(challenge_file("eval_prompts_sharegpt.json"))
    public, private = public_and_held_out(prompts, 64, 64, seed=1)
    assert len(public) == len(private) == 64
    assert not {p.key for p in public} & {p.key for p in private}
    assert public_and_held_out(prompts, 64, 64, seed=1) == (public, private)
    assert public_and_held_out(prompts, 64, 64, seed=7)[0] != public
    with pytest.raises(ValueError, match="held-out private split"):
        public_and_held_out(prompts, 100, 40, seed=1)


def test_inputs_default_sizes_and_audit(small_prompts, small_ppl):
    inputs = load_inputs(VerifyConfig(prompts=small_prompts, ppl_data=small_ppl))
    assert len(inputs.public) == len(inputs.private) == 6  # half of 12, the rest held out
    assert "held-out" in inputs.private_source
    keys = {r.key for r in inputs.records}
    expected = [p.key for p in inputs.public if p.key in keys]
    assert [a.key for a in inputs.audit][: len(expected)] == expected  # matched by id, public order
    assert len(inputs.audit) == min(len(inputs.public), len(inputs.records))


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, words", [
    ("not json", ["not JSON"]),
    ('{"a": 1}', ["JSON list"]),
    ("[]", ["no item"]),
    ('[{"id": "a", "turns": []}]', ["item 0", "conversations"]),
    ('[{"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]}]', ["item 0", "value"]),
    ('[{"conversations": [{"from": "human", "value": "only one turn"}]}]', ["no item"]),
])
def test_bad_prompt_files(tmp_path, text, words):
    with pytest.raises(ValueError) as e:
        load_prompts(_write(tmp_path, "p.json", text))
    for w in words:
        assert w in str(e.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read the prompts file"):
        load_prompts(tmp_path / "nope.json")


GOOD = {"id": "r", "context_token_ids": [2, 5], "target_token_ids": [6, 7]}


@pytest.mark.parametrize("line, words", [
    ("{", ["line 2", "not JSON"]),
    ("[1, 2]", ["JSON object"]),
    (json.dumps({"id": "r", "context_token_ids": [2]}), ["lacks", "target_token_ids"]),
    (json.dumps({**GOOD, "target_token_ids": ["6", 7]}), ["target_token_ids", "integer"]),
    (json.dumps({**GOOD, "context_token_ids": [2, 1.5]}), ["context_token_ids", "integer"]),
    (json.dumps({**GOOD, "target_token_ids": [True]}), ["integer"]),
    (json.dumps({**GOOD, "target_token_ids": []}), ["target_token_ids", "empty"]),
    (json.dumps({**GOOD, "context_token_ids": [-1]}), ["negative"]),
])
def test_bad_ppl_records(tmp_path, line, words):
    with pytest.raises(ValueError) as e:
        load_ppl_records(_write(tmp_path, "r.jsonl", json.dumps(GOOD) + "\n" + line + "\n"))  # bad line 2
    for w in words:
        assert w in str(e.value)


def test_empty_ppl_file(tmp_path):
    with pytest.raises(ValueError, match="no records"):
        load_ppl_records(_write(tmp_path, "r.jsonl", "\n\n"))


def test_reference_outputs(tmp_path):
    path = _write(tmp_path, "o.jsonl", '{"id": "a", "token_ids": [1, 2]}\n{"index": 3, "token_ids": [4]}\n')
    assert load_reference_outputs(path) == {"a": [1, 2], "index:3": [4]}
    with pytest.raises(ValueError, match="token_ids"):
        load_reference_outputs(_write(tmp_path, "bad.jsonl", '{"id": "a", "ids": [1]}\n'))
