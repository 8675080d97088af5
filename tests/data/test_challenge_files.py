"""The challenge's public data ships inside the package, and nothing in src/ looks beside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fastgemma
from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file
from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.data import load_ppl_records, load_prompts

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_packaged_files_hold_the_challenge_data():
    prompts, records = load_prompts(challenge_file(PROMPTS_FILE)), load_ppl_records(challenge_file(PPL_FILE))
    assert len(prompts) == 128 and len(records) == 128
    assert sum(len(r.target_token_ids) for r in records) > 60_000
    assert (challenge_file(PROMPTS_FILE).parent / "PROVENANCE.md").is_file()


def test_the_defaults_read_the_packaged_copy():
    cfg = VerifyConfig()
    assert cfg.prompts_path() == challenge_file(PROMPTS_FILE) and cfg.ppl_path() == challenge_file(PPL_FILE)


def test_unknown_file_is_refused():
    with pytest.raises(ValueError, match="no packaged challenge file"):
        challenge_file("other.json")


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/data beside the repository to compare with")
def test_packaged_copy_equals_the_challenge_files():
    for name in (PROMPTS_FILE, PPL_FILE):
        assert challenge_file(name).read_bytes() == (SHARED / name).read_bytes()


def test_nothing_in_src_reads_beside_the_repository():
    package = Path(fastgemma.__file__).resolve().parent
    offenders = [str(p.relative_to(package)) for p in package.rglob("*.py")
                 if re.search(r"\.\./shared|[\"']shared[\"']\s*/\s*[\"']data", p.read_text())]
    assert offenders == []
