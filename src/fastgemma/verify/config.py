"""What one verification run does: `VerifyConfig` (validated once, never mutated).

How a model is served is an `EngineConfig` (config.py): `serve_args()` builds the
`fastgemma serve` arguments, `plain()` the in-process reference, which keeps every option
that changes the model's numbers (model, dtype, kernels, quantisation, prefill chunk) and
drops the ones that change only the speed (speculation, the lm_head screen, the fused decode
step, the CUDA graph, threads): greedy identity is checked against plain decoding of the
same checkpoint. `--quantization` is the one option with two references: greedy identity
against the quantised model's own plain path, PPL against the unquantised model
(`unquantized()`), so that the cap bounds what quantising costs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file

# --quick: a few prompts and short outputs (about 4 minutes on a 2-core AVX2 CPU in fp32).
QUICK = {"num_prompts": 4, "num_private_prompts": 4, "output_len": 64, "warmup": 1, "num_ppl_records": 2}


@dataclass(frozen=True)
class VerifyConfig:
    url: str | None = None  # an OpenAI-compatible endpoint; None: start `fastgemma serve` with `serve`
    serve: EngineConfig = field(default_factory=EngineConfig)  # the server to start (url None)
    api_key: str | None = None  # bearer token for --url
    prompts: Path | None = None  # sharegpt JSON; None: the packaged challenge prompts
    ppl_data: Path | None = None  # PPL JSONL; None: the packaged challenge records
    private_prompts: Path | None = None  # None: a seeded held-out split of `prompts`
    private_ppl_data: Path | None = None  # None: no private PPL re-run
    num_prompts: int | None = None  # None: all (with private_prompts) or half of the prompt file
    num_private_prompts: int | None = None  # None: as many as num_prompts (held-out: the rest)
    num_ppl_records: int | None = None  # None: every record (first N in file order otherwise)
    output_len: int = 512  # max_tokens with ignore_eos: every request emits exactly this many
    warmup: int = 4  # untimed warm-up requests before each timed run
    seed: int = 1  # prompt order, as bench_serving --seed
    reference_ppl: float | None = None  # None: measure the plain path in-process (model known)
    reference_outputs: Path | None = None  # plain greedy ids (JSONL); None: in-process (model known)
    out: Path = Path("verify-out")  # summary.json, requests.jsonl, record.md, plots, serve.log
    serve_port: int = 0  # port for the started server; 0: a free one
    ready_timeout_s: float = 900.0  # wait this long for GET /v1/models to answer 200
    request_timeout_s: float = 3600.0  # one request at most
    quick: bool = False  # recorded in the summary; QUICK holds the sizes it implies
    progress: bool = True  # progress bars on stderr

    def __post_init__(self) -> None:
        if self.url is not None and self.serve != EngineConfig():
            raise ValueError("--model and serve options (--dtype, --max-model-len) start a server; --url uses a running one: give one or the other")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https:// (got {self.url!r})")
        for name in ("num_prompts", "num_private_prompts", "num_ppl_records"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        if self.output_len < 1:
            raise ValueError(f"--output-len must be >= 1 (got {self.output_len})")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.reference_ppl is not None and not (math.isfinite(self.reference_ppl) and self.reference_ppl >= 1.0):
            raise ValueError(f"--reference-ppl must be a finite number >= 1 (got {self.reference_ppl})")
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"--serve-port must be in [0, 65535] (got {self.serve_port})")
        if self.ready_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")

    @property
    def model_known(self) -> bool:
        """The verifier knows the checkpoint (so it can run the plain path itself)."""
        return self.url is None

    def prompts_path(self) -> Path:
        return self.prompts or challenge_file(PROMPTS_FILE)

    def ppl_path(self) -> Path:
        return self.ppl_data or challenge_file(PPL_FILE)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key")  # never written to the outputs
        d.update(prompts=str(self.prompts_path()), ppl_data=str(self.ppl_path()))
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
