"""The exact lm_head screen's time per decode step: fp32 against int8 activations.

    python benchmarks/lm_head_screen.py [--rows 1,2,4,8,16] [--repetitions 30]

Loads the embedded Gemma 3 270M (bf16), decodes four chat prompts greedily and keeps the
normed hidden states the screen saw (real ones: Gemma's have large outlier channels). Then,
for each row count, times `LmHeadScreen.argmax` on that many hidden states with the model's
screen (int8 activations where the CPU has AVX-512 VNNI, kernels/cpu_screen.c) and with a
screen over the same int8 codes taking fp32 activations (kernels/cpu_quant_gemv.c's GEMV and
a per-row selection), alternating, median over repetitions; also the rows each one
recomputes in full precision (median per row). Both give the plain path's tokens, which it
checks. Last, why the int8 activations have two levels: over the same hidden states, the
candidates a bound with the first level alone would leave (median, 90th percentile, and
how many states exceed V / 8, where the screen falls back to the full lm_head). The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--repetitions", type=int, default=30)
    args = ap.parse_args()

    from fastgemma import LLM, SamplingParams
    from fastgemma.kernels.lm_head_screen import LmHeadScreen

    llm = LLM(dtype="bfloat16")
    screen = llm.model.lm_head_screen
    if screen is None or not screen.int8_activations:
        raise SystemExit("this CPU's screen takes fp32 activations (no AVX-512 VNNI build): nothing to compare")
    seen: list[torch.Tensor] = []
    argmax = screen.argmax

    def keep(hidden, allowed=None):
        seen.append(hidden.clone())
        return argmax(hidden, allowed)

    screen.argmax = keep
    topics = ["photosynthesis", "the history of Rome", "gravity", "how a compiler works"]
    prompts = [llm.chat_prompt_ids([{"role": "user", "content": f"Explain {t} in detail."}]) for t in topics]
    llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    screen.argmax = argmax
    hidden = torch.cat([h for h in seen if h.shape[0] == len(prompts)])  # decode steps' rows
    fp32 = LmHeadScreen(screen.weight, screen.finalize, screen.codes(), int8_activations=False)

    def timed(s: LmHeadScreen, rows: int) -> tuple[float, list[int], float]:
        times, tokens, candidates = [], [], []
        for r in range(args.repetitions):
            batch = hidden[(r * rows) % (hidden.shape[0] - rows) :][:rows]
            t0 = time.perf_counter()
            tokens += s.argmax(batch)
            times.append(time.perf_counter() - t0)
            candidates.append(s.last_candidates / rows)
        return statistics.median(times), tokens, statistics.median(candidates)

    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        timed(screen, rows), timed(fp32, rows)  # warm-up
        a, b = [], []
        for _ in range(2):  # alternating
            a.append(timed(fp32, rows))
            b.append(timed(screen, rows))
        assert all(x[1] == y[1] for x, y in zip(a, b)), "the two screens disagree"
        results.append({
            "rows": rows, "fp32_activations_ms": 1e3 * statistics.median(x[0] for x in a),
            "int8_activations_ms": 1e3 * statistics.median(x[0] for x in b),
            "fp32_candidates": statistics.median(x[2] for x in a), "int8_candidates": statistics.median(x[2] for x in b),
        })
    print(f"{'rows':>4} {'fp32 act. ms':>13} {'int8 act. ms':>13} {'candidates/row':>16}")
    for r in results:
        print(f"{r['rows']:>4} {r['fp32_activations_ms']:>13.2f} {r['int8_activations_ms']:>13.2f} "
              f"{r['fp32_candidates']:>7.0f} / {r['int8_candidates']:<7.0f}")
    one = one_level_candidates(screen, hidden)
    counts = torch.tensor(one, dtype=torch.float64)
    one_level = {"median": float(counts.median()), "p90": float(counts.quantile(0.9)),
                 "fallbacks": int((counts > screen.weight.shape[0] // 8).sum())}
    print(f"first level alone, candidates per hidden state: median {one_level['median']:.0f}, "
          f"p90 {one_level['p90']:.0f}, over V/8 (full-head fallback) {one_level['fallbacks']} of {len(one)}")
    print(json.dumps({"hidden_states": hidden.shape[0], "levels": results, "one_level": one_level}))


def one_level_candidates(screen, hidden: torch.Tensor, chunk: int = 32768) -> list[int]:
    """Per hidden state, the rows the screen's stage 1 (one int8 level of h) leaves as
    candidates: f(a1 + e1) >= f(max a1 - e1), with the screen's own one-level activation term
    (kernels/cpu_screen.c; a1 in fp32 from the integer dots, exact here)."""
    codes, (V, _) = screen.codes()[0], screen.weight.shape
    f = lambda x: screen.finalize(x.to(screen.weight.dtype)).float()  # noqa: E731
    counts = []
    for h in hidden:
        screen.bounds(h[None], with_err=False)
        term = float(screen.activation_error[0, 0]) * (1 + 2.0**-10)
        x = h.float()
        step = x.abs().max() / 127
        p1 = (x / step).round().clamp(-127, 127)
        a1 = torch.cat([codes[i : i + chunk].float() @ p1 for i in range(0, V, chunk)]) * (screen.scales * step)
        hnorm = float(torch.linalg.vector_norm(h.double())) * (1 + 2.0**-20)
        e1 = screen.coef * hnorm + screen.qnorm[:V] * term + a1.abs() * 2.0**-19
        counts.append(int((f(a1 + e1) >= f(a1 - e1).max()).sum()))
    return counts


if __name__ == "__main__":
    main()
