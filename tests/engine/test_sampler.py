"""The sampler: greedy picks the lowest id among ties; temperature, top-k and top-p shape the
distribution as vLLM's do; a seeded generator repeats its draws."""

from __future__ import annotations

import pytest
import torch

from fastgemma.engine.sampler import filtered_probs, sample
from fastgemma.engine.sampling_params import SamplingParams


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0])
    assert sample(logits, SamplingParams(temperature=0.0), None) == 1


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))  # 0.5 + 0.3 reaches 0.75
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert (probs > 0).tolist() == [True, True, True, False]
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.1))  # the first token always stays
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([2.0, 1.0, 0.0])
    cold = filtered_probs(logits, SamplingParams(temperature=0.5))
    hot = filtered_probs(logits, SamplingParams(temperature=2.0))
    assert cold[0] > torch.softmax(logits, -1)[0] > hot[0]


def test_seeded_draws_repeat_and_follow_the_distribution():
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    params = SamplingParams(temperature=1.0, seed=3)

    def draws(n: int) -> list[int]:
        g = torch.Generator().manual_seed(3)
        return [sample(logits, params, g) for _ in range(n)]

    assert draws(50) == draws(50)
    counts = torch.bincount(torch.tensor(draws(2000)), minlength=3) / 2000
    assert counts.tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.05)


@pytest.mark.parametrize("field, value, words", [
    ("temperature", -1.0, r"temperature must be in \[0, 100\] \(0 = greedy\) \(got -1.0\)"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\] \(got 0.0\)"),
    ("max_tokens", 0, r"max_tokens must be an integer >= 1 \(got 0\)"),
    ("logprobs", 21, r"logprobs must be between 0 and 20 \(got 21\)"),
])
def test_bad_params_name_the_one_bad_value(field, value, words):
    with pytest.raises(ValueError, match=words) as e:
        SamplingParams(**{field: value})
    assert "SamplingParams(" not in str(e.value)


def _reference_processing(logits: list[float], prompt: list[int], output: list[int], rep: float, freq: float,
                          pres: float, bias: dict[int, float]) -> list[float]:
    """vLLM's formulas, token by token: bias, repetition penalty, frequency and presence."""
    out = []
    for t, x in enumerate(logits):
        x += bias.get(t, 0.0)
        if t in prompt or t in output:
            x = x / rep if x > 0 else x * rep
        n = output.count(t)
        out.append(x - freq * n - pres * (n > 0))
    return out


def test_penalties_and_bias_follow_vllms_formulas_row_by_row():
    from fastgemma.engine.sampler import process_logits

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]] * 3)
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={4: 1.5, 5: -3.0})
    assert params.processes_logits and not SamplingParams(min_p=0.5).processes_logits
    prompt, output, draft = [0], [3, 3, 1], [2, 3]
    got = process_logits(logits, params, prompt, output, draft)
    for i in range(3):  # row i follows the output and the first i draft tokens
        want = _reference_processing(logits[i].tolist(), prompt, output + draft[:i], 2.0, 0.5, 0.25, {4: 1.5, 5: -3.0})
        assert torch.allclose(got[i], torch.tensor(want)), (i, got[i], want)
    assert not torch.equal(got[0], got[1]) and not torch.equal(got[1], got[2])


@pytest.mark.parametrize("extra", [{"repetition_penalty": 1.7}, {"frequency_penalty": 0.8}, {"presence_penalty": -0.5},
                                   {"logit_bias": {2: 3.0, 30: -1.0}}, {"min_tokens": 6},
                                   {"repetition_penalty": 0.6, "presence_penalty": 1.0, "logit_bias": {7: 1.0}, "min_tokens": 4}])
def test_changed_ids_are_every_id_processing_changes(extra):
    """changed_ids (the ids a screened greedy row gets exactly, engine/llm_engine.py) holds
    every id whose logit process_logits changes in some row, and each kind of change names its
    ids; the rest keep their logits."""
    from fastgemma.engine.sampler import changed_ids, process_logits

    g = torch.Generator().manual_seed(len(extra))
    params = SamplingParams(temperature=0.0, max_tokens=10, **extra)
    prompt, output, draft, stop = [1, 4, 4, 9], [9, 12, 3], [3, 21], [0, 40]
    logits = torch.randn(3, 48, generator=g) * 5
    changed = changed_ids(params, prompt, output, draft, stop)
    assert changed == sorted(set(changed))
    moved = (process_logits(logits, params, prompt, output, draft, stop) != logits).any(0).nonzero()[:, 0].tolist()
    assert set(moved) <= set(changed) and moved
    if "min_tokens" in extra:
        assert set(stop) <= set(changed)
    if extra.get("repetition_penalty", 1.0) != 1.0:
        assert set(prompt + output + draft) <= set(changed)
    assert set(changed) <= set(prompt + output + draft + stop + list(params.logit_bias or ()))
    # processed on some columns only (the screened greedy pick, engine/llm_engine.py): the same numbers there
    full = process_logits(logits, params, prompt, output, draft, stop)
    for columns in (torch.tensor(changed + [47]), torch.arange(0, 48, 3), torch.tensor([], dtype=torch.long)):
        columns = columns.unique()
        part = process_logits(logits[:, columns], params, prompt, output, draft, stop, columns=columns)
        assert torch.equal(part, full[:, columns])


def test_min_p_drops_tokens_below_its_share_of_the_top_probability():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, min_p=0.25))  # keeps p >= 0.125
    assert (probs > 0).tolist() == [True, True, True, False]
    assert torch.allclose(probs[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                         ("repetition_penalty", 0.0), ("min_p", 1.5), ("logit_bias", {1: 200.0}),
                                         ("logit_bias", {-1: 1.0}), ("logit_bias", {"1": 1.0})])
def test_bad_penalties_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_masks_the_stop_ids_in_the_rows_before_it():
    from fastgemma.engine.sampler import process_logits

    params = SamplingParams(max_tokens=8, min_tokens=3)
    assert not params.processes_logits and params.processes_logits_at(2) and not params.processes_logits_at(3)
    got = process_logits(torch.zeros(3, 6), params, [0], [4], draft=[5, 5], stop_ids=[1, 2])
    assert torch.isinf(got[:2, [1, 2]]).all() and not torch.isinf(got[:2, [0, 3, 4, 5]]).any()
    assert not torch.isinf(got[2]).any()  # the third output token may end the sequence
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_stop_strings_before_min_tokens_do_not_count():
    from fastgemma.llm import _find_stop

    text = "ab.cd.ef"
    assert _find_stop(text, ["."], 0) == 2
    assert _find_stop(text, ["."], 0, floor=3) == 5  # the first "." ends inside text[:3]
    assert _find_stop(text, ["d.e"], 0, floor=5) == 4  # ends after text[:5]: counts
    assert _find_stop(text, ["cd"], 0, floor=5) == -1
