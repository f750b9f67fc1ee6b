"""`deepres profile docs/examples/profile_llama.py:build --precision bf16`: a Llama-3.2-1B-shaped
decoder (published hyper-parameters, no weights) fine-tuned with AdamW on 4 sequences of 2048 tokens."""

import torch
import transformers
from torch import nn


def build():
    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True, use_cache=False)
    model = transformers.AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    tokens = torch.randint(0, config.vocab_size, (4, 2048))

    def loss_fn(output, targets):
        logits = output.logits.float()
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return model, optimizer, (tokens, tokens), loss_fn
