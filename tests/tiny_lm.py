"""Tiny random-weight causal LMs for the generation tests (no model hub, no download): a BPE
tokenizer trained here on a few words, with a chat template, and a Llama- or GPT-2-style
model from a config, saved with save_pretrained. Outputs are meaningless but deterministic."""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "red",
    "running",
    "shoes",
    "summarise",
    "this",
    "product",
    "review",
    "great",
    "value",
]


def tiny_lm(path, style: str, context: int = 64):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0 if style == "llama" else 1)
    if style == "llama":
        cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                          bos_token_id=1, eos_token_id=2, pad_token_id=3)  # fmt: skip
        model = LlamaForCausalLM(cfg)
    else:
        cfg = GPT2Config(vocab_size=fast.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=context,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3)  # fmt: skip
        model = GPT2LMHeadModel(cfg)
    model.eval().save_pretrained(path)
    fast.save_pretrained(path)
    return path
