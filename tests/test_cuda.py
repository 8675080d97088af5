"""The decoder on a CUDA device (skipped without one): fp32 logits vs transformers, bf16 runs,
the CUDA graph of the fixed-shape step (engine/static_step.py) against the same step run
eagerly, exact speculative verification, and quantised linears through the graph."""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams
from tests.engine.test_speculative import PROMPTS, _PartlyRight
from tests.tiny_models import reference_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_cuda_fp32_matches_transformers(name, request):
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="float32", device="cuda", max_model_len=64)
    ids = torch.randint(0, llm.spec.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = reference_model(folder)(ids[None]).logits[0]
    got = llm.runner.prompt_logprobs(ids.tolist())
    ref_lp = torch.log_softmax(ref[:-1].double(), -1).gather(1, ids[1:, None])[:, 0]
    ours = torch.tensor([e.logprob for e in got[1:]], dtype=torch.float64)
    assert (ours - ref_lp).abs().max() < 1e-4


def test_cuda_bf16_generates(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="bfloat16", device="cuda", max_model_len=128)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 40
    sampled = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True))[0]
    assert len(sampled.token_ids) == 8


# ---- the fixed-shape decode step and its CUDA graph (engine/static_step.py) ----------------

GREEDY_70 = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)  # > 8 sliding windows


def _tokens(llm: LLM, params: SamplingParams = GREEDY_70) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_cuda_graph_replays_the_eager_step_bit_for_bit(name, request):
    folder = request.getfixturevalue(name)
    graph = LLM(str(folder), dtype="bfloat16", device="cuda", max_model_len=128)
    eager = LLM(str(folder), dtype="bfloat16", device="cuda", max_model_len=128, enforce_eager=True)
    assert graph.runner.static_steps and eager.runner.static_steps
    assert _tokens(graph) == _tokens(eager)
    steps = list(graph.runner.static.values())  # one fixed-shape step per cache slot used
    assert steps and all(s.use_graph and s.graph is not None for s in steps)  # captured once, replayed since
    assert not any(s.use_graph for s in eager.runner.static.values())
    ids = list(range(3, 30))
    for llm in (graph, eager):
        llm.runner.prefill(ids)
    for i in range(40):
        a = graph.runner.decode(i + 5, len(ids) + i)
        b = eager.runner.decode(i + 5, len(ids) + i)
        assert torch.equal(a, b)


def test_cuda_kernels_torch_runs_the_per_op_path(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="bfloat16", device="cuda", max_model_len=128, kernels="torch")
    assert not llm.runner.static_steps
    assert len(_tokens(llm)[0]) == 70


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
def test_cuda_verification_rows_are_the_decode_steps_bits(name, request):
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="bfloat16", device="cuda", max_model_len=128, speculative="ngram",
              num_speculative_tokens=5)
    runner, ids, draft = llm.runner, list(range(3, 30)), [11, 12, 13, 14, 15]
    runner.prefill(ids[:-1])
    rows = runner.verify([ids[-1], *draft], len(ids) - 1, greedy=False)
    runner.prefill(ids[:-1])
    steps = [runner.decode(t, len(ids) - 1 + i) for i, t in enumerate([ids[-1], *draft])]
    assert torch.equal(rows, torch.stack(steps))


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
def test_cuda_speculative_greedy_is_identical_to_plain(name, request):
    folder = request.getfixturevalue(name)
    expected = _tokens(LLM(str(folder), dtype="bfloat16", device="cuda", max_model_len=128))
    for k in (1, 3, 7):
        spec = LLM(str(folder), dtype="bfloat16", device="cuda", max_model_len=128, speculative="ngram",
                   num_speculative_tokens=k, prompt_lookup_min=1)
        assert _tokens(spec) == expected
        spec.engine.proposer = _PartlyRight({tuple(p): e for p, e in zip(PROMPTS, expected)}, k)
        assert _tokens(spec) == expected
        stats = spec.engine.spec_stats
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_cuda_quantized_decode_is_identical_to_its_eager_step(scheme, tiny_e4b):
    graph = LLM(str(tiny_e4b), dtype="bfloat16", device="cuda", max_model_len=128, quantization=scheme)
    eager = LLM(str(tiny_e4b), dtype="bfloat16", device="cuda", max_model_len=128, quantization=scheme,
                enforce_eager=True)
    assert _tokens(graph) == _tokens(eager)


def test_cuda_bench_decode_runs_every_engine_on_the_gpu(tiny_text_model, tmp_path):
    import json

    from typer.testing import CliRunner

    from fastgemma.cli.main import app

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Tell me a story."}]}] * 2))
    result = CliRunner().invoke(app, [
        "bench", "decode", "--model", str(tiny_text_model), "--prompts", str(prompts), "--num-prompts", "2",
        "--output-len", "24", "--dtype", "bfloat16", "--speculative", "none,ngram", "-q", "none,int8",
        "--compare", "transformers", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"fastgemma", "fastgemma ngram", "fastgemma int8", "fastgemma int8 ngram", "transformers"} <= set(out["engines"])
    identity = out["greedy_identity_vs_plain_path"]
    assert all(identity[name]["identical_prompts"] == 2 for name in identity if name != "checked")


def test_ple_table_stays_in_pinned_host_memory_and_gives_the_device_tables_bits(tiny_e4b):
    """Only each step's PLE rows travel to the GPU; the outputs are those of the table kept
    on the device (the graph path and the eager path alike)."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompt = [3, 17, 99, 4, 250, 31, 7]
    for eager in (True, False):
        llm = LLM(str(tiny_e4b), device="cuda", dtype="bfloat16", max_model_len=64, enforce_eager=eager)
        model = llm.model
        assert model.ple_host is not None and model.ple_host.is_pinned() and model.embed_tokens_per_layer is None
        ids = torch.tensor(prompt, device="cuda")
        assert torch.equal(model.ple_rows(ids), model.ple_host.to("cuda")[ids])
        offloaded = llm.generate([prompt], params)[0].token_ids
        model.embed_tokens_per_layer = torch.nn.Embedding.from_pretrained(model.ple_host.to("cuda"))
        model.ple_host = None
        llm.runner.static.clear()  # fixed-shape steps made again, without host staging
        assert llm.generate([prompt], params)[0].token_ids == offloaded
