"""Every stage end to end against a real `fastgemma serve` (tiny random Gemma 3, fp32)."""

from __future__ import annotations

import json
import math

import pytest

from fastgemma.verify.audit import audit_prompts, run_audit
from fastgemma.verify.client import Client
from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.data import load_ppl_records, load_prompts, shuffled
from fastgemma.verify.identity import compare
from fastgemma.verify.ppl import run_ppl
from fastgemma.verify.run import run_verify
from fastgemma.verify.tps import run_tps


@pytest.fixture(scope="module")
def client(served_tiny):
    with Client(served_tiny.url) as c:
        yield c


def test_tps_stage(client, small_prompts):
    prompts = shuffled(load_prompts(small_prompts), 1)[:3]
    result = run_tps(client, "tiny", prompts, output_len=8, warmup=1, progress=False)
    assert [r.completion_tokens for r in result.requests] == [8, 8, 8]  # ignore_eos honoured
    assert [r.key for r in result.requests] == [p.key for p in prompts]
    assert result.output_tps == pytest.approx(24 / result.duration_s)
    assert result.total_tps == pytest.approx((24 + sum(r.prompt_tokens for r in result.requests)) / result.duration_s)
    assert result.duration_s >= sum(r.latency_s for r in result.requests) * 0.99  # one at a time
    assert all(r.prompt_tokens > 5 and 0 < r.ttft_s for r in result.requests)
    stats = result.stats()
    assert stats["p99_latency_ms"] >= stats["median_latency_ms"] > 0
    assert not result.off_length


def test_audit_capture_matches_plain_greedy(client, small_prompts, small_ppl, tiny_reference):
    prompts = audit_prompts(load_prompts(small_prompts)[:2], load_ppl_records(small_ppl), 2)
    captured = run_audit(client, "tiny", prompts, output_len=12, progress=False)
    assert all(len(c.token_ids) == 12 for c in captured)
    identity = compare(captured, tiny_reference.greedy(prompts, 12), "in-process")
    assert identity.holds is True and len(identity.prompts) == 2


def test_ppl_stage_matches_the_in_process_path(client, small_ppl, tiny_reference):
    records = load_ppl_records(small_ppl)
    served = run_ppl(client, "tiny", records, progress=False)
    reference = tiny_reference.ppl(records)
    assert served.num_tokens == sum(len(r.target_token_ids) for r in records) == reference.num_tokens
    assert served.ppl == pytest.approx(reference.ppl, rel=1e-4)
    # token-weighted: exp of the summed NLL over all targets, not a mean of per-record PPLs
    assert served.ppl == pytest.approx(math.exp(sum(r.nll for r in served.records) / served.num_tokens))
    assert 1.0 < served.ppl < 1e7


def _verify_url(url: str, small_prompts, small_ppl, out, **kw):
    cfg = VerifyConfig(url=url, prompts=small_prompts, ppl_data=small_ppl, num_prompts=2, num_private_prompts=2,
                       output_len=8, warmup=1, out=out, progress=False, **kw)
    return run_verify(cfg, log=lambda m: None)


def test_planted_divergence_end_to_end(served_tiny, small_prompts, small_ppl, tiny_reference, tmp_path):
    from fastgemma.verify.inputs import load_inputs

    cfg = VerifyConfig(prompts=small_prompts, ppl_data=small_ppl, num_prompts=2, num_private_prompts=2, output_len=8)
    audit = load_inputs(cfg).audit
    greedy = tiny_reference.greedy(audit, 8)
    planted_key = audit[1].key
    greedy[planted_key][5] = (greedy[planted_key][5] + 1) % 1000
    refs = tmp_path / "refs.jsonl"
    refs.write_text("".join(json.dumps({"id": k, "token_ids": v}) + "\n" for k, v in greedy.items()))
    ref_ppl = tiny_reference.ppl(load_ppl_records(small_ppl)).ppl

    summary = _verify_url(served_tiny.url, small_prompts, small_ppl, tmp_path / "out",
                          reference_outputs=refs, reference_ppl=ref_ppl)
    assert summary["verdict"] == "INVALID"
    prompts = {p["id"]: p for p in summary["identity"]["prompts"]}
    assert prompts[planted_key]["first_divergence"] == 5
    assert prompts[audit[0].key]["identical"] is True
    assert any(f"{planted_key} at token 5" in r for r in summary["reasons"])
    assert summary["ppl"] <= summary["cap"] == pytest.approx(ref_ppl * 1.05)
    _check_outputs(tmp_path / "out", summary)


def test_unknown_endpoint_without_references_is_pending(served_tiny, small_prompts, small_ppl, tmp_path):
    summary = _verify_url(served_tiny.url, small_prompts, small_ppl, tmp_path)
    checks = {c["name"]: c["status"] for c in summary["checks"]}
    assert checks["greedy identity"] == "pending" and checks["ppl cap"] == "pending"
    assert summary["cap"] is None and summary["identity"]["holds"] is None
    assert summary["verdict"] == ("INVALID" if "fail" in checks.values() else "PENDING")
    assert "held-out" in summary["private_source"]


def _check_outputs(out, summary):
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["verdict"] == summary["verdict"] and on_disk["tps"] == pytest.approx(summary["tps"])
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    stages = [r["stage"] for r in rows]
    assert stages.count("tps") == stages.count("tps-private") == 2 and stages.count("audit") == 2
    assert stages.count("ppl") == 4 and stages.count("identity") == 2
    record = (out / "record.md").read_text().split("---")
    front = dict(line.split(": ", 1) for line in record[1].strip().splitlines())
    assert float(front["tps"]) == pytest.approx(summary["tps"], abs=0.01)
    assert float(front["ppl"]) == pytest.approx(summary["ppl"], abs=1e-4)
    assert json.loads(front["verdict"]) == summary["verdict"]
    for png in ("tps_per_request.png", "ppl_per_record.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(summary["versions"]) >= {"fastgemma", "torch", "python"}
    assert "api_key" not in summary["configuration"]
