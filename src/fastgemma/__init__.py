"""fastgemma: a fast, faithful inference stack for Google's Gemma models.

    from fastgemma import LLM, SamplingParams
"""

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.llm import LLM
from fastgemma.outputs import CompletionOutput, RequestOutput

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
