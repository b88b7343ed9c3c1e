"""A small model directory shaped like a real chat model, written offline: a byte-level BPE tokenizer trained on a
few sentences, a chat template, end tokens in config.json, generation_config.json and the tokenizer, and random
tiny weights.

    write_real_model_dir(out, style="llama3")  # Llama: BOS added by the tokenizer and written by the template
    write_real_model_dir(out, style="chatml")  # Qwen2: no BOS, <|im_start|>/<|im_end|> turns

`REAL_STYLES[style]` names the special tokens, so tests can look their ids up in the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

SENTENCES = [
    "What is 12 + 30? The answer is 42.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Think step by step, then put the final answer in \\boxed{}.",
    "You are a helpful assistant. Answer briefly.",
    "#### 72",
] * 4

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

REAL_STYLES = {
    "llama3": {
        "architecture": "llama",
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",  # the tokenizer's: end of a turn
        "config_eos": ["<|end_of_text|>"],
        "generation_eos": ["<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"],  # a list, as Llama 3.1 writes it
        "template": LLAMA3_TEMPLATE,
    },
    "chatml": {
        "architecture": "qwen2",
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "config_eos": ["<|endoftext|>"],
        "generation_eos": ["<|im_end|>", "<|endoftext|>"],
        "template": CHATML_TEMPLATE,
    },
}


def build_bpe_tokenizer(style: str):
    """A trained byte-level BPE as a fast Hugging Face tokenizer, with the style's specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    s = REAL_STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=s["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    if s["bos"]:  # Llama's tokenizer puts BOS before any text it encodes
        bos_id = tok.token_to_id(s["bos"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s['bos']} $A", special_tokens=[(s["bos"], bos_id)]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=s["bos"],
        eos_token=s["eos"],
        pad_token=s["specials"][0] if s["bos"] is None else s["specials"][1],
    )
    hf.chat_template = s["template"]
    return hf


def write_real_model_dir(
    out: str | Path, style: str = "llama3", hidden_size: int = 64, layers: int = 2, max_positions: int = 256
) -> Path:
    """Tokenizer files, config.json, generation_config.json and random safetensors weights in `out`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    s = REAL_STYLES[style]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_bpe_tokenizer(style)
    tokenizer.save_pretrained(out)
    ids = tokenizer.convert_tokens_to_ids
    shape = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_positions,
        "bos_token_id": ids(s["bos"]) if s["bos"] else None,
        "eos_token_id": [ids(t) for t in s["config_eos"]],
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
        "initializer_range": 0.2,  # wide enough that greedy decoding does not repeat one token
    }
    config = LlamaConfig(**shape) if s["architecture"] == "llama" else Qwen2Config(**shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    GenerationConfig(
        bos_token_id=shape["bos_token_id"],
        eos_token_id=[ids(t) for t in s["generation_eos"]],
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out)
    return out


def set_generation_eos(model_dir: str | Path, eos: list[int]) -> None:
    """Rewrite generation_config.json's end tokens (as a model card's update would)."""
    path = Path(model_dir) / "generation_config.json"
    cfg = json.loads(path.read_text())
    cfg["eos_token_id"] = eos
    path.write_text(json.dumps(cfg, indent=2))


def ground_truth_reward(response: str, row: dict) -> float:
    """1 when the response holds the row's ground truth; reads the normalised row's fields, so a row that did
    not go through the loader's schema is a reward error."""
    truth, _ = row["ground_truth"], row["data_source"]
    return float(truth in response)
