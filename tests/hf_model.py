"""A real HF model directory built on the fly (no downloads): a tiny Llama-shaped causal LM with
tied embeddings, a byte-level BPE tokenizer trained with `tokenizers` on a small corpus, a chat
template and a generation config, all written with `save_pretrained`. Shared by every test that
needs a model directory (`hf_model_dir` fixture in tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["copy the digits 0123456789 then stop", "the answer is 42 #### 42",
          "user: what is 7+5? assistant: 12", "reason step by step, then answer"] * 50


def build_hf_model_dir(path, vocab_size: int = 256, hidden_size: int = 32, layers: int = 2,
                       heads: int = 2, max_positions: int = 128) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM,
                              PreTrainedTokenizerFast)

    path = Path(path)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    eos = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         bos_token_id=fast.bos_token_id, eos_token_id=eos,
                         pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    GenerationConfig(bos_token_id=fast.bos_token_id, eos_token_id=eos,
                     pad_token_id=fast.pad_token_id).save_pretrained(path)
    return path
