"""The SmolLM2 directory written by `laminar model import` loads in transformers and in the engine, and both
decode the same greedy tokens for a chat prompt. The directory is ~0.5 GB and outside the repository: the test
runs where `LAMINAR_SMOLLM2` names it (`laminar model import SmolLM2-135M-Instruct.Q4_1.gguf --out DIR`)."""

import os
from pathlib import Path

import pytest
import torch

MODEL_DIR = os.environ.get("LAMINAR_SMOLLM2", "")
pytestmark = pytest.mark.skipif(
    not (MODEL_DIR and (Path(MODEL_DIR) / "config.json").is_file()),
    reason="set LAMINAR_SMOLLM2 to an imported SmolLM2-135M-Instruct directory",
)
NEW_TOKENS = 8


def test_engine_and_transformers_decode_the_same_greedy_tokens_for_a_chat_prompt():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from laminar.engine import Engine, SamplingParams

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    messages = [{"role": "user", "content": "What is 12 + 7? Put the final answer in \\boxed{}."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")  # the template came through the import
    prompt = tok(text, add_special_tokens=False)["input_ids"]

    hf = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    assert hf.config.tie_word_embeddings and hf.config.eos_token_id == tok.eos_token_id
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    want = want[0, len(prompt) :].tolist()

    engine = Engine.from_pretrained(MODEL_DIR, max_num_seqs=1, num_kv_blocks=16, use_cuda_graphs=False)
    engine.add_request("0", prompt, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
    got = []
    while engine.has_unfinished():
        got += [t for f in engine.step().finished for t in f.output_token_ids]
    assert got == want, (tok.decode(got), tok.decode(want))
