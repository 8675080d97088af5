"""fastgemma: a fast, faithful inference stack for Google's Gemma models.

    from fastgemma import LLM, SamplingParams, StructuredOutputsParams

The names below are imported on first use (PEP 562), so that `fastgemma --help` and tools
that only read the configuration do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"

_WHERE = {
    "LLM": "fastgemma.llm",
    "SamplingParams": "fastgemma.engine.sampling_params",
    "StructuredOutputsParams": "fastgemma.engine.structured_output",
    "RequestOutput": "fastgemma.outputs",
    "CompletionOutput": "fastgemma.outputs",
}

if TYPE_CHECKING:
    from fastgemma.engine.sampling_params import SamplingParams
    from fastgemma.engine.structured_output import StructuredOutputsParams
    from fastgemma.llm import LLM
    from fastgemma.outputs import CompletionOutput, RequestOutput


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fastgemma' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
