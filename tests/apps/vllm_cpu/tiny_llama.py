"""A tiny Llama that vLLM loads, built here from a config: random weights, a BPE tokenizer trained on a few lines, a
chat template. Nothing is downloaded. Used by ``app.py`` (in its replica) and by the vLLM backend's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The engine's arguments on the CPU for this model, wherever one is made of it (the app, the tests, the bench): no
# compilation, its short context, and 64 MiB of KV cache (16,384 tokens, far more than they ask at once).
CPU_ENGINE_ARGS: dict[str, Any] = {"enforce_eager": True, "max_model_len": 256, "kv_cache_memory_bytes": 64 << 20}


def build(folder: Path) -> Path:
    """Save the model and its tokenizer in ``folder`` (a model folder vLLM loads) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # Metaspace (SentencePiece's way with spaces), not byte-level: every token is whole characters, so each one the
    # random model picks has text of its own (a byte-level token may be part of a character, whose text a
    # detokenizer holds back until the rest comes), and a benchmark's first text is its first token.
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    raw.train_from_iterator(["hello world", "the quick brown fox jumps over the lazy dog", "user: assistant:"] * 20,
                            trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    tokenizer.save_pretrained(folder)
    # Heads of 64: vLLM's CPU attention takes no smaller one (16 is "Unsupported CPU attention configuration").
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
