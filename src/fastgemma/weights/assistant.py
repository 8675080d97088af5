"""Load a Gemma 4 assistant (MTP drafter) checkpoint: `--draft-model PATH`.

A folder (or hub id, e.g. `google/gemma-4-E4B-it-assistant`) with a `gemma4_assistant`
config and `Gemma4AssistantForCausalLM` safetensors: `model.*` (its text decoder, every
layer KV-shared: q/o projections, norms, MLP, `layer_scalar`), `pre_projection`,
`post_projection`, and with `use_ordered_embeddings` `masked_embedding.centroids` and
`masked_embedding.token_ordering`. The lm_head is tied to `model.embed_tokens`. Checked
against the target it drafts for (`AssistantSpec.check_target`) before any tensor is read.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from fastgemma.kernels import KernelChoice
from fastgemma.models.assistant import AssistantSpec, Gemma4Assistant
from fastgemma.models.spec import ArchSpec, arch_spec_from_config
from fastgemma.weights.checkpoint import open_tensors
from fastgemma.weights.loader import check_present, fill_state, required_tensors
from fastgemma.weights.source import resolve_model

ASSISTANT_MODEL_TYPE = "gemma4_assistant"


def assistant_spec_from_config(config) -> AssistantSpec:
    text = replace(arch_spec_from_config(config.get_text_config()), tie_word_embeddings=True)
    if text.per_layer_input_size:
        raise ValueError("a Gemma 4 assistant has no per-layer inputs (hidden_size_per_layer_input must be 0)")
    if not all(layer.kv_shared for layer in text.layers):
        raise ValueError("every layer of a Gemma 4 assistant must be KV-shared with its target")
    if not getattr(config, "tie_word_embeddings", True):
        raise ValueError("assistants with an lm_head of their own (tie_word_embeddings false) are not supported")
    ordered = bool(getattr(config, "use_ordered_embeddings", False))
    return AssistantSpec(
        text=text,
        backbone_hidden_size=int(config.backbone_hidden_size),
        num_centroids=int(config.num_centroids) if ordered else None,
        centroid_top_k=int(config.centroid_intermediate_top_k),
    )


def load_assistant(
    draft_model: str, target: ArchSpec, dtype: torch.dtype, device: torch.device, max_model_len: int,
    kernels: KernelChoice = KernelChoice(),
) -> Gemma4Assistant:
    from transformers import AutoConfig

    source = resolve_model(draft_model)
    if source.kind != "folder":
        raise ValueError(f"--draft-model {draft_model!r}: pass a Gemma 4 assistant folder or hub id, not a GGUF file")
    model_type = json.loads((source.path / "config.json").read_text()).get("model_type")
    if model_type != ASSISTANT_MODEL_TYPE:
        raise ValueError(
            f"--draft-model {draft_model!r} has model_type {model_type!r}; MTP drafting needs a "
            f"{ASSISTANT_MODEL_TYPE} checkpoint (e.g. google/gemma-4-E4B-it-assistant)"
        )
    try:
        config = AutoConfig.from_pretrained(source.path)
    except Exception as e:
        raise ValueError(f"cannot load the config of {draft_model}: {e}") from e
    spec = assistant_spec_from_config(config)
    spec.check_target(target)

    required = required_tensors(spec.text)
    required.update({n: [n] for n in ("pre_projection.weight", "post_projection.weight")})
    if spec.num_centroids is not None:
        required["centroids.weight"] = ["masked_embedding.centroids.weight"]
        required["token_ordering"] = ["masked_embedding.token_ordering"]
    tensors = open_tensors(source)
    check_present(required, tensors, "the draft model")
    with torch.device("meta"):
        model = Gemma4Assistant(spec, max_model_len, kernels)
    state = fill_state(model, required, tensors, spec.text, dtype, device)
    unset = set(model.state_dict()) - set(state)
    assert not unset, f"assistant loader does not fill {sorted(unset)}"
    model.load_state_dict(state, assign=True)
    return model.requires_grad_(False).to_device(device).eval()
