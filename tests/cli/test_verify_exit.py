"""`fastgemma verify`'s exit status is its verdict: 0 VERIFIED, 1 INVALID, 3 PENDING."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import fastgemma.verify
from fastgemma.cli.main import app


@pytest.mark.parametrize("verdict,code", [("VERIFIED", 0), ("INVALID", 1), ("PENDING", 3)])
def test_exit_status_is_the_verdict(monkeypatch, verdict, code):
    reasons = [] if verdict == "VERIFIED" else [f"a check gave {verdict}"]
    monkeypatch.setattr(fastgemma.verify, "run_verify", lambda cfg: {"verdict": verdict, "reasons": reasons})
    result = CliRunner().invoke(app, ["verify", "--json"])
    assert result.exit_code == code, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["verdict"] == verdict
    if code:
        assert f"verdict {verdict}: a check gave {verdict}" in result.stderr
