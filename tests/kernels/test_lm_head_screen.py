"""The exact lm_head screen (kernels/lm_head_screen.py).

Its contract has two halves, tested separately: the per-row bound holds for every row and
every hidden state we can think of (random, huge, tiny, sparse, and the worst case for
Cauchy-Schwarz: h parallel to a row's quantisation residual), and the token it returns is
the plain path's argmax, ties included (lowest id), with and without softcap.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native
from fastgemma.kernels.lm_head_screen import LmHeadScreen, pack_bitmask, unpack_bitmask

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")

HAS_VNNI = native.load() is not None and hasattr(native.load(), "screen_u8s8")


@pytest.fixture(params=[False, pytest.param(True, marks=pytest.mark.skipif(not HAS_VNNI, reason="no AVX-512 VNNI build"))],
                ids=["fp32-activations", "int8-activations"])
def int8_activations(request) -> bool:
    """Both ways of computing the approximate logits: fp32 h against the int8 codes, and h
    quantised to int8 too (the VNNI GEMV, whose bound has the activations' term)."""
    return request.param


def _weight(V: int, D: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, D, generator=g) * torch.rand(V, 1, generator=g) * 3
    w[: V // 8] *= 0.01  # some rows far smaller than others
    w[5] = w[V - 7]  # exact duplicates: ties in every logit
    w[77] = w[3]
    return w.to(dtype).contiguous()


def _fp32_sums(weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """What the full-precision GEMV computes before rounding to the model dtype."""
    lib, (V, D) = native.load(), weight.shape
    out = torch.empty(V, dtype=torch.float32)
    if weight.dtype == torch.bfloat16:
        lib.gemv_bf16(weight.data_ptr(), h.contiguous().data_ptr(), out.data_ptr(), 1, V, D, 1)
    else:
        lib.gemv_f32(weight.data_ptr(), h.contiguous().data_ptr(), out.data_ptr(), 1, V, D)
    return out


def _hidden_states(screen: LmHeadScreen, dtype: torch.dtype, n: int = 40):
    g = torch.Generator().manual_seed(1)
    w = screen.weight.double()
    residual = w - screen.codes()[0].double() * screen.scales.double()[:, None]
    D = w.shape[1]
    for i in range(n):
        kind = i % 6
        if kind == 0:
            h = torch.randn(D, generator=g)
        elif kind == 1:
            h = torch.randn(D, generator=g) * 10.0 ** float(torch.randint(-6, 7, (), generator=g))
        elif kind == 2:
            h = torch.zeros(D)
            h[torch.randint(0, D, (3,), generator=g)] = torch.randn(3, generator=g) * 100
        elif kind == 3:  # parallel to a row's residual: Cauchy-Schwarz is tight there
            row = int(torch.randint(0, w.shape[0], (), generator=g))
            h = residual[row].float() / residual[row].norm().clamp(min=1e-30) * 50
        elif kind == 4:  # along a row: its logit dominates
            row = int(torch.randint(0, w.shape[0], (), generator=g))
            h = w[row].float() + 0.01 * torch.randn(D, generator=g)
        else:  # one outlier: int8 activations round the rest to few levels (or to zero)
            h = torch.randn(D, generator=g) * 10.0 ** float(torch.randint(-3, 1, (), generator=g))
            h[int(torch.randint(0, D, (), generator=g))] = 300.0
        yield h.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D", [640, 1001])
def test_bound_is_never_violated(dtype, D, int8_activations):
    weight = _weight(4096, D, dtype)
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    worst = 0.0
    for h in _hidden_states(screen, dtype):
        approx, err, _, _ = screen.bounds(h[None])[0]
        approx, err = approx.clone(), err.clone()
        z = _fp32_sums(weight, h)
        exact = weight.double() @ h.double()
        assert ((z.double() - approx.double()).abs() <= err.double()).all()
        assert ((exact - approx.double()).abs() <= err.double()).all()
        worst = max(worst, float(((exact - approx.double()).abs() / err.double().clamp(min=1e-300)).max()))
    assert worst > 0.5  # the residual-parallel states come close: the bound is not vacuous


def _levels(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """cpu_screen.c's two int8 levels of x: (p1, p2, t1, t2) with x ~ t1 p1 + t2 p2, each
    level symmetric int8 of what the one before left (the codes as fp32, the steps fp32)."""
    t1 = x.abs().max() / 127
    p1 = (x / t1).round().clamp(-127, 127)
    left = x.double() - t1.double() * p1.double()
    t2 = left.abs().max().float() / 127
    p2 = (left / t2.double()).float().round().clamp(-127, 127)
    return p1, p2, t1, t2


def _level_terms(x: torch.Tensor) -> tuple[float, float]:
    """The activations' bound terms: |x - t1 p1| + 2^-20 |t1 p1| (one level) and
    |x - t1 p1 - t2 p2| + 2^-20 (|t1 p1| + |t2 p2|) (both)."""
    p1, p2, t1, t2 = _levels(x)
    one, two = t1.double() * p1.double(), t2.double() * p2.double()
    return (float((x.double() - one).norm() + 2.0**-20 * one.norm()),
            float((x.double() - one - two).norm() + 2.0**-20 * (one.norm() + two.norm())))


def _softcap(cap: float):
    table = None

    def finalize(x: torch.Tensor) -> torch.Tensor:
        nonlocal table
        if table is None:
            every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            table = torch.tanh(every / cap) * cap
        return table[x.view(torch.int16).long() + 2**15]

    return finalize


@pytest.mark.parametrize("cap", [None, 30.0, 0.5])
def test_screened_argmax_is_the_plain_argmax(cap, int8_activations):
    weight = _weight(8192, 640, torch.bfloat16, seed=3)
    finalize = (lambda x: x) if cap is None else _softcap(cap)
    screen = LmHeadScreen(weight, finalize, int8_activations=int8_activations)
    for h in _hidden_states(screen, torch.bfloat16, n=60):
        plain = finalize(_fp32_sums(weight, h).to(torch.bfloat16))
        assert screen.argmax(h[None])[0] == int(torch.argmax(plain))
        assert 1 <= screen.last_candidates <= weight.shape[0]


def test_ties_go_to_the_lowest_id(int8_activations):
    weight = _weight(1024, 640, torch.bfloat16)
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    h = weight[1024 - 7].float().to(torch.bfloat16)  # rows 5 and 1017 are equal and win
    assert screen.argmax(h[None])[0] == 5
    saturating = _softcap(0.5)  # every large logit saturates to the same bf16 value
    screen = LmHeadScreen(weight, saturating, int8_activations=int8_activations)
    h = (weight[100].float() * 50).to(torch.bfloat16)
    plain = saturating(_fp32_sums(weight, h).to(torch.bfloat16))
    assert (plain == plain.max()).sum() > 1 and screen.argmax(h[None])[0] == int(torch.argmax(plain))


@pytest.mark.parametrize("cap", [None, 30.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_selection_is_the_definition(cap, dtype, int8_activations):
    """cpu_screen.c's bound and candidates equal the module docstring's formulas in torch:
    fp32 activations in one stage; int8 activations in two, the second level only in the
    16-row blocks the first leaves open."""
    if dtype == torch.float32 and cap is not None:
        pytest.skip("fp32 with a softcap: the screen is off by design")
    weight = _weight(8192, 640, dtype, seed=5)
    V = weight.shape[0]
    finalize = (lambda x: x) if cap is None else _softcap(cap)
    screen = LmHeadScreen(weight, finalize, int8_activations=int8_activations)
    f = lambda x: finalize(x.to(dtype)).float()  # noqa: E731
    for h in _hidden_states(screen, dtype, n=25):
        approx, err, count, ids = screen.bounds(h[None])[0]
        hnorm = float(torch.linalg.vector_norm(h.double())) * (1 + 2.0**-20)
        if not int8_activations:
            assert torch.equal(err, screen.coef * hnorm + approx.abs() * 2.0**-19)
            expected = (f(approx + err) >= f(approx - err).max()).nonzero()[:, 0]
            assert count == expected.numel() and torch.equal(ids, expected)
            continue
        one, two = _level_terms(h.float())
        assert screen.activation_error[0].tolist() == pytest.approx([one, two], rel=1e-9)
        t1, t2 = (float(term) * (1 + 2.0**-10) for term in screen.activation_error[0])
        qnorm, codes = screen.qnorm[:V], screen.codes()[0].float()
        p1, p2, s1, s2 = _levels(h.float())
        a1 = (codes @ p1) * (screen.scales * s1)  # the integer dots are exact in fp32 here (|d| < 2^24)
        e1 = screen.coef * hnorm + qnorm * t1 + a1.abs() * 2.0**-19
        first = f(a1 - e1).max()
        opened = (f(a1 + e1) >= first).view(-1, 16).any(dim=1).repeat_interleave(16)  # the blocks left open
        a2 = a1 + (codes @ p2) * (screen.scales * s2)
        e2 = screen.coef * hnorm + qnorm * t2 + a2.abs() * 2.0**-19
        assert torch.equal(approx, torch.where(opened, a2, a1)) and torch.equal(err, torch.where(opened, e2, e1))
        best = torch.maximum(f((a1 - e1).max()), f((a2 - e2)[opened].max()) if opened.any() else first)
        expected = (opened & (f(a2 + e2) >= best)).nonzero()[:, 0]
        assert count == expected.numel() and torch.equal(ids, expected)


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [V] -> int32 [ceil(V / 32)] (bit i & 31 of word i >> 5)."""
    padded = torch.zeros((allowed.numel() + 31) // 32 * 32, dtype=torch.int64)
    padded[: allowed.numel()] = allowed.long()
    words = (padded.view(-1, 32) << torch.arange(32)).sum(1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _masks(V: int, g: torch.Generator):
    """Allowed sets as a grammar makes them: a few ids, a tenth, most, every one."""
    yield torch.zeros(V, dtype=torch.bool).index_fill_(0, torch.randint(0, V, (3,), generator=g), True)
    yield torch.rand(V, generator=g) < 0.1
    yield torch.rand(V, generator=g) < 0.9
    yield torch.ones(V, dtype=torch.bool)


@pytest.mark.parametrize("cap", [None, 30.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_masked_screen_is_the_plain_masked_argmax(cap, dtype, int8_activations):
    """With a grammar's bitmask the screen gives the lowest allowed id of the largest allowed
    logit, and its candidates are allowed rows within the allowed rows' bounds (the native
    selection restricted to them), so it stays a screen, not a fallback to the full head."""
    if dtype == torch.float32 and cap is not None:
        pytest.skip("fp32 with a softcap: the screen is off by design")
    weight = _weight(8192, 640, dtype, seed=7)
    finalize = (lambda x: x) if cap is None else _softcap(cap)
    screen = LmHeadScreen(weight, finalize, int8_activations=int8_activations)
    g = torch.Generator().manual_seed(2)
    screened = 0
    for h in _hidden_states(screen, dtype, n=30):
        plain = finalize(_fp32_sums(weight, h).to(dtype))
        for allowed in _masks(weight.shape[0], g):
            mask = _bitmask(allowed)
            assert torch.equal(unpack_bitmask(mask, weight.shape[0]), allowed) and torch.equal(pack_bitmask(allowed), mask)
            want = int(torch.argmax(plain.masked_fill(~allowed, float("-inf"))))
            assert screen.argmax(h[None], [mask])[0] == want
            approx, err, count, ids = screen.bounds(h[None], [mask])[0]
            best = finalize((approx - err).to(dtype))[allowed].max()
            expected = (allowed & (finalize((approx + err).to(dtype)) >= best)).nonzero()[:, 0]
            assert count == expected.numel() and torch.equal(ids, expected)
            screened += count < weight.shape[0] // 8
    assert screened > 60  # most of the 120 (state, mask) pairs were decided by the screen


@pytest.mark.parametrize("cap", [None, 30.0])
def test_sparse_logits_keep_every_processed_argmax(cap, int8_activations):
    """sparse_logits(h, keep, grammar): the argmax after any processing that changes only the
    keep ids (here: the raw top ids pushed far down, random shifts, a tied duplicate pair
    split) is the full logits' argmax after it, lowest id on ties, with or without a grammar;
    the entries it computes are the full logits' bits, and it prunes most of the vocabulary."""
    weight = _weight(8192, 640, torch.bfloat16, seed=11)
    V = weight.shape[0]
    finalize = (lambda x: x) if cap is None else _softcap(cap)
    screen = LmHeadScreen(weight, finalize, int8_activations=int8_activations)
    g = torch.Generator().manual_seed(5)
    pruned = cases = 0
    for h in _hidden_states(screen, torch.bfloat16, n=24):
        plain = finalize(_fp32_sums(weight, h).to(torch.bfloat16))
        top = torch.topk(plain.float(), 6).indices
        processings = [
            (top.sort().values, torch.full((6,), -1e4)),  # the raw favourites ruled out
            (torch.randperm(V, generator=g)[:50].sort().values, torch.randn(50, generator=g) * 4),
            (torch.tensor([5, 17]), torch.tensor([0.0, -1e4])),  # 5 ties with V - 7 (identical rows)
            (torch.tensor([], dtype=torch.long), torch.tensor([])),
        ]
        for keep, shift in processings:
            for allowed in (None, torch.rand(V, generator=g) < 0.5):
                full = plain.float().clone()
                full[keep] += shift
                mask = None if allowed is None else pack_bitmask(allowed)
                sparse = screen.sparse_logits(h[None], [keep], None if mask is None else [mask])[0]
                got = sparse.float().clone()
                got[keep] += shift
                if allowed is not None:
                    full, got = full.masked_fill(~allowed, float("-inf")), got.masked_fill(~allowed, float("-inf"))
                assert int(torch.argmax(got)) == int(torch.argmax(full)), (keep, allowed is None)
                computed = torch.isfinite(sparse) | (sparse == plain)
                assert torch.equal(sparse[keep].view(torch.int16), plain[keep].view(torch.int16))
                assert torch.equal(sparse[computed].view(torch.int16), plain[computed].view(torch.int16))
                pruned += int(computed.sum()) < V // 8
                cases += 1
    assert pruned > cases // 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_screened_together_are_screened_alone(dtype, int8_activations):
    """Nine hidden states in one call (more than one tile of the VNNI kernel), some with a
    grammar mask and some without: each row's approximate logits, bound and candidates are
    those of the row screened alone (a decode step's rows do not see each other)."""
    weight = _weight(4099, 640, dtype, seed=11)  # not a multiple of 16 rows
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    g = torch.Generator().manual_seed(4)
    hidden = torch.stack(list(_hidden_states(screen, dtype, n=9)))
    masks = [None if t % 3 else _bitmask(torch.rand(4099, generator=g) < 0.5) for t in range(9)]
    together = [(r.approx.clone(), r.err.clone(), r.count, r.ids.clone()) for r in screen.bounds(hidden, masks)]
    for t in range(9):
        approx, err, count, ids = screen.bounds(hidden[t : t + 1], [masks[t]])[0]
        assert torch.equal(approx, together[t][0]) and torch.equal(err, together[t][1])
        assert count == together[t][2] and torch.equal(ids, together[t][3])
    assert screen.argmax(hidden, masks) == [screen.argmax(hidden[t : t + 1], [masks[t]])[0] for t in range(9)]


def test_masked_full_head_fallback_stays_masked(int8_activations):
    weight = _weight(1024, 640, torch.bfloat16)
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    flat = torch.zeros(1, 640, dtype=torch.bfloat16)  # every logit 0: the lowest allowed id wins
    few = torch.zeros(1024, dtype=torch.bool)
    few[[700, 900]] = True
    assert screen.argmax(flat, [_bitmask(few)])[0] == 700 and screen.last_candidates == 2
    most = torch.arange(1024) >= 100  # too many candidates: the full head, masked
    assert screen.argmax(flat, [_bitmask(most)])[0] == 100 and screen.last_candidates == 1024


@pytest.mark.skipif(not HAS_VNNI, reason="no AVX-512 VNNI build")
def test_codes_held_in_vnni_order_come_back_row_major():
    """The int8-activation screen keeps its codes in VNNI order; `codes()` (what the ready
    cache stores) gives the row-major codes back, and a screen built from them is the same."""
    weight = _weight(1000, 643, torch.bfloat16)  # rows and columns that need padding
    rows = LmHeadScreen(weight, lambda x: x, int8_activations=False).codes()
    vnni = LmHeadScreen(weight, lambda x: x, int8_activations=True)
    assert all(torch.equal(a, b) for a, b in zip(vnni.codes(), rows))
    again = LmHeadScreen(weight, lambda x: x, codes=vnni.codes(), int8_activations=True)
    assert torch.equal(again.packed, vnni.packed) and torch.equal(again.qnorm, vnni.qnorm)


def test_non_monotone_post_processing_is_refused():
    with pytest.raises(ValueError, match="not monotone"):
        LmHeadScreen(_weight(256, 64, torch.bfloat16), lambda x: -x)
    with pytest.raises(ValueError, match="fp32 logits"):
        LmHeadScreen(_weight(256, 64, torch.float32), lambda x: x * 2)


def test_flat_distribution_takes_the_full_head(int8_activations):
    weight = _weight(1024, 640, torch.bfloat16)
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    assert screen.argmax(torch.zeros(1, 640, dtype=torch.bfloat16))[0] == 0  # every logit 0: the lowest id
    assert screen.last_candidates == 1024


def test_non_finite_hidden_state_falls_back_to_the_full_head(int8_activations):
    weight = _weight(512, 640, torch.bfloat16)
    screen = LmHeadScreen(weight, lambda x: x, int8_activations=int8_activations)
    h = torch.full((1, 640), float("inf"), dtype=torch.bfloat16)
    assert screen.argmax(h)[0] == int(torch.argmax(_fp32_sums(weight, h[0]).to(torch.bfloat16)))
    assert screen.last_candidates == 512


def test_softcap_table_is_monotone(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="bfloat16", device="cpu", max_model_len=64)
    assert llm.model.spec.final_softcap is not None
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = every[torch.isfinite(every)].float().sort().values.to(torch.bfloat16)
    out = llm.model.finalize_logits(finite).float()
    assert (out[1:] >= out[:-1]).all()


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_screened_greedy_decoding_is_identical(name, dtype, request):
    llm = LLM(str(request.getfixturevalue(name)), dtype=dtype, device="cpu", max_model_len=128)
    model = llm.model
    if not model.screen_supported():
        pytest.skip("fp32 with a softcap: the screen is off by design")
    assert model.lm_head_screen is not None
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    prompts = [[1, 2, 3], list(range(5, 40)), [9] * 12]
    screened = [o.token_ids for o in llm.generate(prompts, params)]
    full = LLM.from_config(replace(llm.config, lm_head_screen=False))
    assert full.model.lm_head_screen is None
    assert screened == [o.token_ids for o in full.generate(prompts, params)]


def test_screened_greedy_is_identical_on_the_embedded_model(eval_prompts):
    """Several real prompts x 256 tokens, bf16: the screen changes nothing."""
    llm = LLM(dtype="bfloat16")
    assert llm.model.lm_head_screen is not None
    prompts = [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in eval_prompts[:3]]
    params = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    screened = [o.token_ids for o in llm.generate(prompts, params)]
    del llm
    full = LLM(dtype="bfloat16", lm_head_screen=False)
    assert full.model.lm_head_screen is None
    assert screened == [o.token_ids for o in full.generate(prompts, params)]
