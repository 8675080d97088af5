"""The Fast Gemma Challenge's public data, shipped inside the package (see PROVENANCE.md).

- `eval_prompts_sharegpt.json`: the 128 public speed-benchmark prompts (sharegpt format);
- `ppl_ground_truth_tokens.jsonl`: the 128 PPL records `{id, context_token_ids, target_token_ids}`.

`challenge_file(name)` is where `verify`, `bench decode` and `tune` read them when no
`--prompts` / `--ppl-data` is given. Owns only where the files are; `verify/data.py` reads them.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PROMPTS_FILE = "eval_prompts_sharegpt.json"
PPL_FILE = "ppl_ground_truth_tokens.jsonl"


def challenge_file(name: str) -> Path:
    """The packaged file `name` (PROMPTS_FILE or PPL_FILE) as a path on disk.

    setuptools installs the package as plain files (regular and editable installs alike), so
    the resource is a real path; a zipped install is refused with the reason.
    """
    if name not in (PROMPTS_FILE, PPL_FILE):
        raise ValueError(f"no packaged challenge file {name!r}; there are {PROMPTS_FILE} and {PPL_FILE}")
    resource = files(__name__) / name
    if not isinstance(resource, Path):
        raise ValueError(f"fastgemma is installed zipped, so {name} is not a file on disk; "
                         "reinstall it unzipped or pass the file with --prompts / --ppl-data")
    return resource
