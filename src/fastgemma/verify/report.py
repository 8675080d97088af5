"""A run's outputs in `--out`: summary.json, requests.jsonl, record.md, plots; the verdict table.

- `summary.json`: the summary object (`run.py` builds it); `--json` prints the same object.
- `requests.jsonl`: one line per request of every stage (`stage` names it): timed TPS
  requests, audit captures, PPL records (served and reference), identity per prompt.
- `record.md`: a markdown record whose front matter holds `tps`, `ppl` and `verdict`.
- `tps_per_request.png`, `ppl_per_record.png` (`plots.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUMMARY, REQUESTS, RECORD = "summary.json", "requests.jsonl", "record.md"


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj, indent=2) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.2f}%"


def markdown_record(summary: dict[str, Any]) -> str:
    pub, priv = summary["public"], summary["private"]
    front = {"tps": round(summary["tps"], 2), "ppl": round(summary["ppl"], 4), "verdict": summary["verdict"],
             "model": summary["endpoint"]["model"], "date": summary["started_at"]}
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in front.items()), "---", "",
             f"# fastgemma verify: {summary['endpoint']['model']} — {summary['verdict']}", "",
             "| measure | value |", "| --- | --- |"]
    rows = [
        ("TPS (output tokens / s, public)", _fmt(pub["output_tps"], 2)),
        ("TPS (private re-run)", _fmt(priv["output_tps"], 2)),
        ("total TPS (public)", _fmt(pub["total_tps"], 2)),
        ("mean / p99 latency (ms)", f"{pub['mean_latency_ms']:.0f} / {pub['p99_latency_ms']:.0f}"),
        ("mean TTFT (ms)", _fmt(pub["mean_ttft_ms"], 0)),
        ("PPL (served)", _fmt(summary["ppl"])), ("PPL reference", _fmt(summary["reference_ppl"])),
        ("PPL cap", _fmt(summary["cap"])), ("PPL target tokens", str(summary["ppl_num_tokens"])),
        ("quantization (ΔPPL vs unquantised)", f"{summary['quantization'] or 'as served'} ({_pct(summary['ppl_delta'])})"),
        ("greedy identity", str(summary["identity"]["holds"])),
        ("speculative acceptance (public run)", _spec(summary.get("speculation"))),
        ("server resident memory after the run", _mib(summary.get("server_resident_mib"))),
        ("prompts", f"{pub['num_requests']} public + {priv['num_requests']} private ({summary['private_source']})"),
        ("output len", str(pub["output_len"])),
    ]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| check | status | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in summary["checks"]]
    lines += ["", "Measured by `fastgemma verify` (methodology: sglang bench_serving v0.5.2, `vllm-chat`).", ""]
    return "\n".join(lines)


def _mib(value: float | None) -> str:
    return "not reported" if value is None else f"{value:.0f} MiB"


def _spec(spec: dict[str, Any] | None) -> str:
    if not spec:
        return "none reported"
    return (f"mean acceptance length {spec['mean_acceptance_length']:.2f} over {spec['num_drafts']} drafts, "
            f"acceptance rate {spec['acceptance_rate']:.2f}")


def render_table(summary: dict[str, Any]) -> None:
    """The verdict table for people, on stderr-free stdout (rich)."""
    from rich.console import Console
    from rich.table import Table

    pub, priv = summary["public"], summary["private"]
    table = Table(title=f"fastgemma verify — {summary['endpoint']['model']}: {summary['verdict']}")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail")
    style = {"pass": "green", "fail": "red", "pending": "yellow", "info": "cyan"}
    for c in summary["checks"]:
        table.add_row(c["name"], f"[{style[c['status']]}]{c['status']}[/]", c["detail"])
    console = Console()
    console.print(table)
    console.print(
        f"TPS {pub['output_tps']:.2f} tok/s public, {priv['output_tps']:.2f} private; total TPS {pub['total_tps']:.2f}; "
        f"latency mean {pub['mean_latency_ms']:.0f} ms, p99 {pub['p99_latency_ms']:.0f} ms; TTFT mean {pub['mean_ttft_ms']:.0f} ms; "
        f"PPL {summary['ppl']:.4f} over {summary['ppl_num_tokens']} tokens (cap {_fmt(summary['cap'])}; "
        f"quantization {summary['quantization'] or 'as served'}, ΔPPL {_pct(summary['ppl_delta'])})"
    )
    if summary.get("speculation"):
        console.print(f"speculative decoding (public run): {_spec(summary['speculation'])}")
    console.print(f"server resident memory after the run: {_mib(summary.get('server_resident_mib'))}")
    console.print(f"verdict: {summary['verdict']}" + "".join(f"\n  - {r}" for r in summary["reasons"]))
    console.print(f"outputs: {summary['outputs']['dir']}")
