"""Checkpoint resolution and loading: from the user's `model` argument to a ready decoder.

`load(config)` is the one entry point: resolve the source, read its config, build the
`ArchSpec`, read the tensors, build the decoder (quantising it when `config.quantization`
asks and the checkpoint is not quantised already, or keeping a GGUF's own blocks under
`gguf`; what that converted, and the lm_head screen, cached in ready form for the next load:
weights/ready.py), the vision / audio towers when the checkpoint is a multimodal Gemma 4
(always, no flag turns them off), and the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastgemma.config import EngineConfig
from fastgemma.kernels.schemes import GGUF
from fastgemma.memory import release_free_memory
from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.spec import ArchSpec, arch_spec_from_config
from fastgemma.models.towers import MultimodalTowers, load_towers
from fastgemma.tokenizer import Tokenizer
from fastgemma.weights.checkpoint import (
    generation_eos_ids,
    gguf_meta_folder,
    load_config,
    open_tensors,
    tower_name,
)
from fastgemma.weights.loader import MAPPED, assemble, checkpoint_state
from fastgemma.weights.quantize import checkpoint_scheme
from fastgemma.weights.ready import ReadyEntry
from fastgemma.weights.source import ModelSource, resolve_model

if TYPE_CHECKING:
    import torch

    from fastgemma.kernels.quant import QuantScheme


@dataclass
class LoadedModel:
    source: ModelSource
    spec: ArchSpec
    model: GemmaForCausalLM
    tokenizer: Tokenizer
    max_model_len: int
    quantization: str  # the scheme the decoder runs with ("none" when unquantised)
    hf_config: Any  # transformers' config of the checkpoint (placeholder ids, tower configs)
    towers: MultimodalTowers | None = None  # Gemma 4 vision / audio towers, when the checkpoint has them


def _decoder_state(
    source: ModelSource,
    spec: ArchSpec,
    ready: ReadyEntry,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    stored: QuantScheme | None,
    quantize_to: QuantScheme | None,
) -> dict[str, torch.Tensor]:
    """The decoder's state dict: from the ready entry when this load converts something (a
    GGUF, quantising on load; on the CPU) and the entry holds it, else from the checkpoint —
    then written to the entry for the next load. Embedding tables a folder stores as they
    run are mapped from the folder (loader.MAPPED), never copied into the entry."""
    converts = device.type == "cpu" and (source.kind == "gguf" or quantize_to is not None)
    state = ready.read("state") if converts else None
    if state is not None:
        if source.kind == "folder":  # the tables the entry left in the folder
            tensors = open_tensors(source)
            for key in MAPPED:
                if key not in state and key in tensors and (mapped := tensors.mapped(key, dtype)) is not None:
                    state[key] = mapped
            tensors.close()
        return state
    tensors = open_tensors(source)
    state = checkpoint_state(spec, tensors, dtype, device, max_model_len, stored, quantize_to)
    in_folder = {k for k in MAPPED if k in state and source.kind == "folder" and tensors.dtype(k) == dtype}
    tensors.close()
    if converts:
        ready.write("state", {k: v for k, v in state.items() if k not in in_folder})
    return state


def load(config: EngineConfig) -> LoadedModel:
    source = resolve_model(config.model)
    hf_config = load_config(source)
    spec = arch_spec_from_config(hf_config, extra_eos_ids=generation_eos_ids(source))
    max_model_len = config.resolve_max_model_len(spec.max_position_embeddings)
    stored = checkpoint_scheme(hf_config)
    wanted = config.quant_scheme()
    if stored is not None and wanted is not None and wanted != stored:
        raise ValueError(
            f"{source.name} is already quantised as {stored.name}; drop --quantization or pass the original model"
        )
    dtype, device, kernels = config.torch_dtype(), config.torch_device(), config.kernel_choice()
    if wanted == GGUF and (source.kind != "gguf" or device.type != "cpu"):
        raise ValueError(
            f"--quantization gguf keeps a GGUF file's own blocks and runs on the CPU; {source.name} "
            f"{'is not a .gguf file' if source.kind != 'gguf' else f'runs on {device.type}'}: use none, int8 or int4-g32"
        )
    scheme = stored or wanted
    ready = ReadyEntry(source, dtype, scheme.name if scheme else "none")
    quantize_to = None if stored is not None else wanted
    state = _decoder_state(source, spec, ready, dtype, device, max_model_len, stored, quantize_to)
    screen = ready.read("screen") if device.type == "cpu" and kernels.lm_head_screen else None
    model = assemble(
        spec, state, dtype, device, max_model_len, scheme, kernels,
        screen_codes=None if screen is None else (screen["qweight"], screen["scales"], screen["coef"]),
    )
    del state
    if model.lm_head_screen is not None and screen is None:
        ready.write("screen", dict(zip(("qweight", "scales", "coef"), model.lm_head_screen.codes())))
    towers = None
    if getattr(hf_config, "model_type", None) == "gemma4":  # Gemma 3's vision tower is not wired in
        towers = load_towers(hf_config, open_tensors(source, tower_name), config.torch_dtype(), config.torch_device())
    release_free_memory()
    folder = gguf_meta_folder(source.path) if source.kind == "gguf" else source.path
    return LoadedModel(
        source, spec, model, Tokenizer.from_folder(folder), max_model_len, scheme.name if scheme else "none",
        hf_config, towers,
    )
