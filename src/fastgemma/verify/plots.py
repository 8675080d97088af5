"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- `tps_per_request.png`: each timed request's own rate (completion tokens / latency), public
  and private runs side by side, with each run's TPS (tokens / wall clock) as a line;
- `ppl_per_record.png`: each record's PPL on the served path, the reference's where measured.
"""

from __future__ import annotations

from pathlib import Path

from fastgemma.verify.ppl import PplResult
from fastgemma.verify.tps import TpsResult


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_tps(runs: list[TpsResult], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    start = 0
    for run, color in zip(runs, ("tab:blue", "tab:orange")):
        xs = list(range(start, start + len(run.requests)))
        ax.bar(xs, [r.tps for r in run.requests], color=color, label=f"{run.stage} per request")
        ax.hlines(run.output_tps, xs[0] - 0.4, xs[-1] + 0.4, colors="black", linestyles="--")
        ax.text(xs[0], run.output_tps, f" {run.stage}: {run.output_tps:.2f} tok/s", va="bottom", fontsize=8)
        start += len(run.requests) + 1
    ax.set_xlabel("request")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Per-request TPS (dashed: TPS of the run, tokens / wall clock)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_ppl(served: PplResult, reference: PplResult | None, cap: float | None, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = list(range(len(served.records)))
    ax.bar(xs, [r.ppl for r in served.records], color="tab:blue", label=f"served (PPL {served.ppl:.4f})")
    if reference is not None:
        ax.plot(xs, [r.ppl for r in reference.records], "k.", label=f"reference (PPL {reference.ppl:.4f})")
    if cap is not None:
        ax.axhline(cap, color="tab:red", linestyle="--", label=f"cap {cap:.4f} (token-weighted PPL)")
    ax.set_xlabel("record")
    ax.set_ylabel("PPL")
    ax.set_title("Per-record PPL (the cap applies to the token-weighted total)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
