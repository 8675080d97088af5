"""The Gemma 4 assistant (MTP drafter) against transformers' `Gemma4AssistantForCausalLM`.

Same inputs on both sides: the target's K/V and final hidden state after a prompt (ours from
our cache, transformers' from its `shared_kv_states`), then three drafting steps at one
position, each feeding back the argmax token and the projected hidden state, as
transformers' `Gemma4AssistantCandidateGenerator` does. Prompts shorter and longer than the
sliding window; the full lm_head and the masked (centroid) one.
"""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM
from tests import tiny_models

TOL = 1e-4


@pytest.fixture(scope="module", params=[False, True], ids=["full-head", "centroid-head"])
def assistant_folder(request, tmp_path_factory):
    config = tiny_models.gemma4_assistant_config(tiny_models.gemma4_e4b_like_config(), ordered=request.param)
    return tiny_models.save_tiny_assistant(config, tmp_path_factory.mktemp("assistant"), seed=7)


def _reference_drafts(target_folder, assistant_folder, ids: list[int], steps: int):
    target = tiny_models.reference_model(target_folder)
    assistant = tiny_models.reference_assistant(assistant_folder)
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids[:-1]]), use_cache=False, output_hidden_states=True,
                     return_shared_kv_states=True)
        kv, h = out.shared_kv_states, out.hidden_states[-1][:, -1:]  # [1, 1, D]
        token, position = torch.tensor([[ids[-1]]]), torch.tensor([[len(ids) - 1]])
        rows = []
        for _ in range(steps):
            x = torch.cat([target.model.embed_tokens(token), h], dim=-1)
            a = assistant(inputs_embeds=x, position_ids=position, shared_kv_states=kv, attention_mask=None)
            rows.append((a.logits[0, 0], a.last_hidden_state[0, 0]))
            token, h = a.logits.argmax(dim=-1), a.last_hidden_state
    return rows


@pytest.mark.parametrize("prompt_len", [5, 21])  # the tiny target's window is 8
def test_draft_logits_match_transformers(tiny_e4b, assistant_folder, prompt_len):
    ids = [(7 * i + 3) % 512 for i in range(prompt_len)]
    expected = _reference_drafts(tiny_e4b, assistant_folder, ids, steps=3)
    llm = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=64, speculative="mtp",
              draft_model=str(assistant_folder), num_speculative_tokens=3)
    proposer = llm.engine.proposer
    llm.runner.prefill(ids[:-1])
    hidden = llm.runner.last_hidden[-1]
    p = len(ids) - 1
    with torch.inference_mode():
        kv = proposer.assistant.context_kv(llm.spec, llm.runner.cache, p)
        token, h = ids[-1], hidden[None]
        for step, (logits_ref, h_ref) in enumerate(expected):
            emb, _ = llm.model.embed(torch.tensor([token]))
            y, h = proposer.assistant(torch.cat([emb, h], dim=-1), p, kv)
            logits = proposer.assistant.logits(y)[0]
            assert (logits - logits_ref).abs().max() < TOL, f"step {step}"
            assert (h[0] - h_ref).abs().max() < TOL, f"step {step}"
            token = int(logits_ref.argmax())
    drafts = proposer.propose(ids, 3, hidden)
    assert drafts == [int(lg.argmax()) for lg, _ in expected]


def test_draft_model_is_checked_against_the_target(tiny_gemma3, tiny_e4b, assistant_folder):
    with pytest.raises(ValueError, match="not a Gemma 4 model"):
        LLM(str(tiny_gemma3), device="cpu", speculative="mtp", draft_model=str(assistant_folder))
    with pytest.raises(ValueError, match="draft model"):
        LLM(str(tiny_e4b), device="cpu", speculative="mtp")
    with pytest.raises(ValueError, match="gemma4_assistant"):
        LLM(str(tiny_e4b), device="cpu", speculative="mtp", draft_model=str(tiny_e4b))
    with pytest.raises(ValueError, match="only used by"):
        LLM(str(tiny_e4b), device="cpu", draft_model=str(assistant_folder))
