# SPDX-License-Identifier: MIT
"""A tiny Llama-architecture model for the engine tests: a config.json and
seeded random weights written by transformers (no download).  Head size 64
and 2 KV heads: the smallest shapes vLLM's CPU attention takes, and KV heads
that split over 2 tensor-parallel ranks."""
import json
import os


def make_tiny_llama(path, seed=1234, layers=2, vocab=512, kv_heads=2, head_dim=64):
    """Write the model to ``path`` (once; the same seed gives the same bytes).
    ``kv_heads`` and ``head_dim`` set the KV block's size without making the
    model bigger than its 256-wide hidden state (the benchmarks' wide
    geometry: a block as large as a real model's)."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                                   num_attention_heads=max(4, kv_heads), num_key_value_heads=kv_heads, head_dim=head_dim,
                                   max_position_embeddings=4096,
                                   initializer_range=0.2, torch_dtype="float32", tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    tmp = path + ".tmp"
    model.save_pretrained(tmp)
    os.replace(tmp, path)
    with open(os.path.join(path, "cxlkv-tiny.json"), "w") as f:
        json.dump(dict(seed=seed, layers=layers, vocab=vocab, kv_heads=kv_heads, head_dim=head_dim), f)
    return path
