"""Every trial of a study as rows: `leaderboard.json`, `leaderboard.md` and `tps_over_trials.png`.

Rows are sorted feasible first, then by TPS. A row is a measured trial (its outcome; a
pruned one has its TPS only; one the winner's re-verification disqualified says so), a
repeat (answered from an earlier trial), or an invalid configuration (refused by the engine
before any server started); its configuration is given as the options that differ from the
engine's defaults, with the hash that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastgemma.tune.study import outcome_of
from fastgemma.verify.plots import pyplot


def rows(study: Any, rejected: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """`rejected`: hash -> reasons, for configurations the winner's re-verification disqualified."""
    rejected = rejected or {}
    out = []
    for t in study.trials:
        attrs = t.user_attrs
        if "outcome" not in attrs and "invalid" not in attrs:
            continue  # interrupted before it was judged
        o = outcome_of(t)
        row: dict[str, Any] = {"trial": t.number, "hash": attrs.get("hash"), "options": attrs.get("options", dict(t.params))}
        if o is None:
            row.update(status="invalid", feasible=False, detail=attrs["invalid"])
        else:
            row.update(o.to_dict())
            if "repeat_of" in attrs:
                row.update(status=f"repeat of #{attrs['repeat_of']}")
            row["detail"] = o.error or _divergence(o)
            if row["hash"] in rejected:
                row.update(status="rejected by re-verification", feasible=False, detail="; ".join(rejected[row["hash"]]))
        out.append(row)
    return sorted(out, key=lambda r: (not r["feasible"], "repeat" in r["status"], -(r.get("tps") or 0.0)))


def _divergence(o: Any) -> str:
    if not o.first_divergence:
        return ""
    return "diverges: " + ", ".join(f"{k} at token {v}" for k, v in list(o.first_divergence.items())[:3])


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "(defaults)"


def _fmt(value: Any, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def markdown(table: list[dict[str, Any]], header: list[str]) -> str:
    lines = [*header, "", "| # | status | TPS | PPL | cap | identical | accept. len | configuration | hash | detail |",
             "| ---: | --- | ---: | ---: | ---: | --- | ---: | --- | --- | --- |"]
    for r in table:
        acc = (r.get("acceptance") or {}).get("mean_acceptance_length")
        lines.append(
            f"| {r['trial']} | {r['status']} | {_fmt(r.get('tps'))} | {_fmt(r.get('ppl'), 4)} | {_fmt(r.get('cap'), 4)} "
            f"| {'' if r.get('identical') is None else ('yes' if r['identical'] else 'no')} | {_fmt(acc)} "
            f"| {_options_text(r['options'])} | {r['hash'] or ''} | {r.get('detail', '')} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: list[dict[str, Any]], path: Path) -> Path:
    """TPS of each measured trial in trial order, feasible or not, and the best feasible so far."""
    plt = pyplot()
    measured = sorted((r for r in table if "repeat" not in r["status"] and r["status"] != "invalid"), key=lambda r: r["trial"])
    fig, ax = plt.subplots(figsize=(8, 4))
    for status, style in (("ok", dict(color="tab:blue", marker="o")), ("identity broken", dict(color="tab:red", marker="x")),
                          ("ppl over cap", dict(color="tab:orange", marker="x")),
                          ("pruned (slower than the best)", dict(color="tab:cyan", marker=".")),
                          ("rejected by re-verification", dict(color="tab:purple", marker="x")),
                          ("failed", dict(color="grey", marker="s"))):
        pts = [(r["trial"], r.get("tps") or 0.0) for r in measured if r["status"] == status]
        if pts:
            ax.scatter(*zip(*pts), label=status, linestyle="none", **style)
    best, xs, ys = 0.0, [], []
    for r in measured:
        if r["feasible"]:
            best = max(best, r["tps"])
        if best:
            xs.append(r["trial"])
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="black", linestyle="--", label="best feasible so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("TPS (output tokens / s)")
    ax.set_title("fastgemma tune: TPS over trials")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(study: Any, out: Path, header: list[str], rejected: dict[str, list[str]] | None = None) -> dict[str, str]:
    table = rows(study, rejected)
    paths = {"json": out / "leaderboard.json", "markdown": out / "leaderboard.md", "plot": out / "tps_over_trials.png"}
    paths["json"].write_text(json.dumps(table, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(table, header))
    plot(table, paths["plot"])
    return {k: str(v) for k, v in paths.items()}
