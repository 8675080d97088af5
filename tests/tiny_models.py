"""Tiny random Gemma checkpoints built from transformers configs, saved with save_pretrained.

Weights are random with non-trivial norm weights and `layer_scalar`, so that a port that
ignores a norm, its offset or the scalar cannot pass. `reference_model` is transformers'
own implementation (eager attention, fp32) of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

SLIDING, FULL = "sliding_attention", "full_attention"


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))  # Gemma 4: w; Gemma 3: 1 + w
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def gemma4_e4b_like_config(vocab_size: int = 512):
    """KV sharing on both layer types, global head dim != head dim, proportional RoPE."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=64, intermediate_size=96,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=2, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=3, layer_types=layer_types, final_logit_softcapping=30.0,
        max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager",
    )


def gemma4_e2b_like_config(vocab_size: int = 512):
    """One KV head, double-wide MLP on the KV-shared layers."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=48, intermediate_size=64,
        num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=4, layer_types=layer_types, use_double_wide_mlp=True,
        final_logit_softcapping=30.0, max_position_embeddings=256, attn_implementation="eager",
    )


def gemma4_k_eq_v_config(vocab_size: int = 512):
    """Full layers whose values are their (un-normed) keys (`attention_k_eq_v`), 1 global KV head."""
    from transformers import Gemma4TextConfig

    layer_types = [SLIDING, SLIDING, FULL, SLIDING, FULL]
    return Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=32, intermediate_size=64,
        num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=8,
        sliding_window=8, num_kv_shared_layers=2, layer_types=layer_types, final_logit_softcapping=30.0,
        max_position_embeddings=256, attn_implementation="eager",
    )


def gemma3_config(vocab_size: int = 512):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=8, layer_types=[SLIDING, SLIDING, FULL, SLIDING], max_position_embeddings=256,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0}},
        attn_implementation="eager",
    )


def save_tiny(config, folder: Path, seed: int = 0) -> Path:
    """Build the causal LM for `config`, randomise it, save it to `folder`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    randomize(model, seed)
    model.save_pretrained(folder)
    return folder


def reference_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


# ---- a tiny multimodal Gemma 4 (Gemma4ForConditionalGeneration) ---------------------------------

# Gemma 4's special tokens sit on ids that are unused / differently named in Gemma 3's
# vocabulary; renaming them turns the embedded Gemma 3 tokenizer into one that Gemma 4's
# preprocessing accepts (same pieces for ordinary text).
GEMMA4_RENAMES = {
    105: "<|turn>", 106: "<turn|>",
    255999: "<|image>", 256000: "<|audio>",
    258880: "<|image|>", 258881: "<|audio|>", 258882: "<image|>", 258883: "<audio|>", 258884: "<|video|>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>',
}
GEMMA4_EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
    "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>",
    "sot_token": "<|turn>", "eot_token": "<turn|>",
}
# Gemma 4's turn format with OpenAI-style content parts (image / audio placeholders in order)
# and its tool-call syntax (declarations, calls with <|"|>-quoted strings, responses), written
# for these tests after the format Gemma 4's template produces.
GEMMA4_TEST_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools -%}{{ '<|turn>system\n' }}{%- for t in tools -%}"
    "{{ '<|tool>declaration:' + t['function']['name'] + '<tool|>' }}{%- endfor -%}{{ '<turn|>\n' }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{{ '<|tool_response>response:' + m['name'] + '{value:<|\"|>' + m['content'] + '<|\"|>}<tool_response|>' }}"
    "{%- else -%}"
    "{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{%- for c in m.get('tool_calls') or [] -%}{{ '<|tool_call>call:' + c['function']['name'] + '{' }}"
    "{%- for k, v in c['function']['arguments'] | dictsort -%}{{ ',' if not loop.first }}{{ k + ':' }}"
    "{%- if v is string -%}{{ '<|\"|>' + v + '<|\"|>' }}{%- else -%}{{ v | tojson }}{%- endif -%}"
    "{%- endfor -%}{{ '}<tool_call|>' }}{%- endfor -%}"
    "{%- if m['content'] is none -%}"
    "{%- elif m['content'] is string -%}{{ m['content'] | trim }}"
    "{%- else -%}{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'text' -%}{{ p['text'] | trim }}"
    "{%- elif p['type'] == 'image' -%}{{ '\n\n<|image|>\n\n' }}"
    "{%- elif p['type'] == 'audio' -%}{{ '<|audio|>' }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<turn|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)


def write_gemma4_tokenizer(folder: Path) -> None:
    """tokenizer.json + tokenizer_config.json: the embedded Gemma 3 tokenizer, Gemma 4's names."""
    import json

    from fastgemma.weights.checkpoint import gguf_meta_folder
    from fastgemma.weights.source import embedded_model_path

    src = gguf_meta_folder(embedded_model_path())
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    old = {i: piece for piece, i in vocab.items() if i in GEMMA4_RENAMES}
    for i, new in GEMMA4_RENAMES.items():
        del vocab[old[i]]
        vocab[new] = i
    for added in tok["added_tokens"]:
        if added["id"] in GEMMA4_RENAMES:
            added["content"], added["special"] = GEMMA4_RENAMES[added["id"]], True
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(extra_special_tokens=GEMMA4_EXTRA_SPECIAL_TOKENS, chat_template=GEMMA4_TEST_CHAT_TEMPLATE)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))


def gemma4_multimodal_config():
    """Full vocabulary (real placeholder ids), tiny widths; vision and audio towers of a few layers."""
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    vocab = 262144
    text = Gemma4TextConfig(
        vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, hidden_size_per_layer_input=4, sliding_window=16, num_kv_shared_layers=1,
        layer_types=[SLIDING, FULL, SLIDING, FULL], final_logit_softcapping=30.0, max_position_embeddings=1024,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    vision = Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, position_embedding_size=256, patch_size=16, pooling_kernel_size=3, standardize=True,
    )
    audio = Gemma4AudioConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],  # [0] = mel bins
        conv_kernel_size=5, output_proj_dims=24,
    )
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=audio)


def save_tiny_multimodal(folder: Path, seed: int = 5, image_soft_tokens: int = 70) -> Path:
    """A tiny random `Gemma4ForConditionalGeneration` folder: weights, Gemma 4 tokenizer and
    the image / audio preprocessing settings (`processor_config.json`)."""

    from transformers import Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(gemma4_multimodal_config())
    randomize(model, seed)
    with torch.no_grad():  # the vision tower's standardisation: finite, non-trivial
        vt = model.model.vision_tower
        vt.std_bias.copy_(0.1 * torch.randn(vt.std_bias.shape))
        vt.std_scale.copy_(1.0 + 0.2 * torch.randn(vt.std_scale.shape))
    model.save_pretrained(folder)
    write_gemma4_tokenizer(folder)
    write_gemma4_processor(folder, image_soft_tokens)
    return folder


def write_gemma4_processor(folder: Path, image_soft_tokens: int) -> None:
    """processor_config.json: Gemma 4's image / audio preprocessing settings."""
    import json

    processor = {
        "processor_class": "Gemma4Processor", "image_seq_length": image_soft_tokens, "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": {"image_processor_type": "Gemma4ImageProcessorPil", "max_soft_tokens": image_soft_tokens,
                            "patch_size": 16, "pooling_kernel_size": 3},
        "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 128,
                              "sampling_rate": 16000},
    }
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2))


def gemma4_assistant_config(target, ordered: bool = False):
    """A tiny `gemma4_assistant` drafting for `target` (a Gemma4TextConfig): one layer of each
    type with the target's KV geometry; `ordered`: the masked (centroid) lm_head."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    def geometry(layer_type: str):
        lc = target.per_layer_config[target.layer_types.index(layer_type)]
        return lc.head_dim, lc.num_key_value_heads

    (hd, kv), (ghd, gkv) = geometry(SLIDING), geometry(FULL)
    text = Gemma4TextConfig(
        vocab_size=target.vocab_size, vocab_size_per_layer_input=0, hidden_size=32, intermediate_size=48,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=kv, head_dim=hd, global_head_dim=ghd,
        num_global_key_value_heads=gkv, hidden_size_per_layer_input=0,
        sliding_window=target.sliding_window, num_kv_shared_layers=3, layer_types=[SLIDING, SLIDING, FULL],
        max_position_embeddings=target.max_position_embeddings, rms_norm_eps=1e-6, attn_implementation="eager",
    )
    return Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=target.hidden_size, use_ordered_embeddings=ordered,
        num_centroids=16, centroid_intermediate_top_k=4, attn_implementation="eager",
    )


def save_tiny_assistant(config, folder: Path, seed: int = 0) -> Path:
    """Build a Gemma4AssistantForCausalLM, randomise it (token ordering: a random permutation),
    save it to `folder`."""
    from transformers import Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(config)
    randomize(model, seed)
    if model.masked_embedding is not None:
        g = torch.Generator().manual_seed(seed)
        model.masked_embedding.token_ordering.copy_(torch.randperm(config.text_config.vocab_size, generator=g))
    model.save_pretrained(folder)
    return folder


def reference_assistant(folder: Path):
    from transformers import Gemma4AssistantForCausalLM

    return Gemma4AssistantForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
