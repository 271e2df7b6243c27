#!/usr/bin/env python3
"""Make the real-vLLM suite's models, offline, with random weights.

    make_models.py DIR

writes into DIR:
  llama/     a Llama: 2 layers, hidden 128, 2 heads of 64, 1 KV head
  qwen/      a Qwen2 of the same size
  head16/    a Llama whose heads are 16 wide, which vLLM's CPU attention
             refuses at its first request (not at start)
  lora/      a LoRA adapter for llama/ in PEFT's layout: rank 8 on q_proj
             and v_proj, written with safetensors alone
and DIR/.made once all are written. Each model has a 512-token BPE
tokenizer trained here by `tokenizers` and a chat template. Nothing is
fetched: the weights are seeded, so a second run makes the same files.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = (
    "the a an of to in is was for on that with as by at from it be this are or "
    "pool engine model swap gpu request token stream answer host team bill "
    "hello world say count one two three four five six seven eight nine ten "
    "red green blue quick brown fox jumps over lazy dog user system assistant "
    "what which when where why how can will would should could may might must"
).split()


def corpus():
    """A few thousand lines of the words above, in a seeded order."""
    g = torch.Generator().manual_seed(1)
    for _ in range(4000):
        idx = torch.randint(len(WORDS), (12,), generator=g).tolist()
        yield " ".join(WORDS[i] for i in idx) + " 0123456789 .,:;!?'\"()[]{}<>|/-_+=*&^%$#@~`"


def tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def model(cls, config_cls, heads, kv_heads):
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    return cls(config)


def write_model(path, m, tok):
    m.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)


def write_lora(path, base, rank=8):
    """A PEFT-layout adapter for base's q_proj and v_proj."""
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(2)
    tensors = {}
    cfg = base.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    outs = {"q_proj": cfg.hidden_size, "v_proj": cfg.num_key_value_heads * head_dim}
    for layer in range(cfg.num_hidden_layers):
        for proj, out in outs.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, cfg.hidden_size, generator=g) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.01
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": "llama",
                "r": rank,
                "lora_alpha": 16,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": list(outs),
                "fan_in_fan_out": False,
                "inference_mode": True,
            },
            f,
            indent=2,
        )


def main(out):
    if os.path.exists(os.path.join(out, ".made")):
        return
    os.makedirs(out, exist_ok=True)
    tok = tokenizer()
    llama = model(LlamaForCausalLM, LlamaConfig, heads=2, kv_heads=1)
    write_model(os.path.join(out, "llama"), llama, tok)
    write_model(os.path.join(out, "qwen"), model(Qwen2ForCausalLM, Qwen2Config, heads=2, kv_heads=1), tok)
    write_model(os.path.join(out, "head16"), model(LlamaForCausalLM, LlamaConfig, heads=8, kv_heads=1), tok)
    write_lora(os.path.join(out, "lora"), llama)
    with open(os.path.join(out, ".made"), "w") as f:
        f.write("llama qwen head16 lora\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
