"""The real embedded Gemma 3 270M (GGUF) against transformers fp32 on the challenge data.

- greedy 64 tokens on challenge prompts: token-identical to transformers' `generate`, batched
  in the engine and through the server with concurrent clients;
- `score()` PPL on challenge PPL records: within 0.1% of transformers' teacher-forced PPL;
- the checkpoint re-saved as a Hugging Face folder loads and gives the same logits.
"""

from __future__ import annotations

import math

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.weights.convert import convert_to_hf_folder

pytestmark = pytest.mark.slow

NUM_PROMPTS, MAX_TOKENS, NUM_RECORDS = 4, 64, 8


def _chat_ids(llm: LLM, text: str) -> list[int]:
    return llm.chat_prompt_ids([{"role": "user", "content": text}])


@pytest.fixture(scope="module")
def greedy_reference(embedded_llm_fp32, embedded_reference, eval_prompts) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, transformers' greedy MAX_TOKENS tokens) for the first challenge prompts."""
    out = []
    for text in eval_prompts[:NUM_PROMPTS]:
        ids = _chat_ids(embedded_llm_fp32, text)
        with torch.no_grad():
            gen = embedded_reference.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
            )
        out.append((ids, gen[0, len(ids) :].tolist()))
    return out


def test_greedy_matches_transformers(embedded_llm_fp32, greedy_reference):
    """The prompts batched together (continuous batching) give transformers' tokens."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [o.token_ids for o in embedded_llm_fp32.generate([ids for ids, _ in greedy_reference], params)]
    for got, (_, expected) in zip(ours, greedy_reference):
        first_diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        assert got == expected, f"diverges at generated position {first_diff}"


def test_served_concurrent_greedy_matches_transformers(embedded_llm_fp32, greedy_reference):
    """Concurrent clients, arriving one after another while the others decode, through the server."""
    import threading
    import time

    import httpx

    from fastgemma.server import ServerThread

    got: dict[int, list[int]] = {}

    def client(i: int, ids: list[int], url: str) -> None:
        time.sleep(0.3 * i)  # staggered: each joins a running batch
        body = {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600)
        got[i] = r.json()["choices"][0]["token_ids"]

    with ServerThread(embedded_llm_fp32, max_queue=8) as server:
        threads = [threading.Thread(target=client, args=(i, ids, server.url)) for i, (ids, _) in enumerate(greedy_reference)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [got[i] for i in range(len(greedy_reference))] == [expected for _, expected in greedy_reference]


def _ppl(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))


def test_score_ppl_matches_transformers(embedded_llm_fp32, embedded_reference, ppl_records):
    ours, theirs = [], []
    for rec in ppl_records[:NUM_RECORDS]:
        ids = rec["context_token_ids"] + rec["target_token_ids"]
        n_ctx = len(rec["context_token_ids"])
        lps = embedded_llm_fp32.score(ids)
        assert lps[0] is None and len(lps) == len(ids)
        ours += [-lp for lp in lps[n_ctx:]]
        with torch.no_grad():
            logits = embedded_reference(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        theirs += (-logp[n_ctx - 1 :]).tolist()
    assert len(ours) == len(theirs) > 1000
    ppl_ours, ppl_ref = _ppl(ours), _ppl(theirs)
    assert abs(ppl_ours / ppl_ref - 1) < 1e-3, (ppl_ours, ppl_ref)


def test_hf_folder_conversion_gives_same_logits(embedded_llm_fp32, embedded_reference, tmp_path):
    from transformers import AutoModelForCausalLM

    convert_to_hf_folder(None, tmp_path, dtype="float32")  # the GGUF's values exactly
    from_folder = LLM(str(tmp_path), dtype="float32", device="cpu", max_model_len=2048)
    assert from_folder.source.kind == "folder"
    ids = _chat_ids(from_folder, "Name three rivers in Europe.")
    assert ids == _chat_ids(embedded_llm_fp32, "Name three rivers in Europe.")
    a = torch.tensor([e.logprob for e in from_folder.prompt_logprobs(ids)[1:]])
    b = torch.tensor([e.logprob for e in embedded_llm_fp32.prompt_logprobs(ids)[1:]])
    assert (a - b).abs().max() < 1e-5
    params = SamplingParams(max_tokens=16, temperature=0.0)
    assert from_folder.generate([ids], params)[0].token_ids == embedded_llm_fp32.generate([ids], params)[0].token_ids
    # The folder is a valid transformers checkpoint: same logits as transformers' own GGUF load.
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        x = torch.tensor([ids])
        assert (hf(x).logits - embedded_reference(x).logits).abs().max() < 1e-5
