"""A real tokenizer's shape (byte-level BPE, chat template, end tokens in three files) takes the same path as the
demo's: prompts are templated with the generation prompt, generation stops on every declared end token, and a
checkpoint is a whole Hugging Face model directory."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laminar.config import TrainerConfig
from laminar.data.codec import TaskCodec
from laminar.engine import Engine, ModelConfig, SamplingParams
from laminar.trainer.trainer import Trainer
from tests.realmodel import REAL_STYLES, set_generation_eos, write_real_model_dir

CHAT = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_real_model_dir(tmp_path_factory.mktemp("llama3"), "llama3")


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory):
    return write_real_model_dir(tmp_path_factory.mktemp("chatml"), "chatml")


def ids_of(codec, names):
    return [codec.tokenizer.convert_tokens_to_ids(n) for n in names]


def test_a_chat_prompt_round_trips_with_the_generation_prompt_and_one_bos(llama_dir):
    codec = TaskCodec.from_dir(llama_dir)
    ids = codec.encode_prompt(CHAT)
    text = codec.tokenizer.decode(ids)
    assert text == codec.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ids[0] == codec.bos_id and ids.count(codec.bos_id) == 1  # the template's BOS, not a second one
    assert codec.encode_prompt("What is 12 + 30?") == ids  # a string is a user turn when there is a template
    raw = TaskCodec.from_dir(llama_dir, chat_template="never").encode_prompt("What is 12 + 30?")
    assert (
        raw[0] == codec.bos_id
        and raw.count(codec.bos_id) == 1
        and "assistant" not in codec.tokenizer.decode(raw)
    )
    assert codec.tokenizer.decode(raw[1:]) == "What is 12 + 30?"


def test_chatml_has_no_bos_and_the_system_prompt_comes_first(chatml_dir):
    codec = TaskCodec.from_dir(chatml_dir, system_prompt="Be brief.")
    text = codec.tokenizer.decode(codec.encode_prompt(CHAT))
    assert codec.bos_id is None
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "Show your work."}, *CHAT]  # a row's own system message is kept
    assert codec.tokenizer.decode(codec.encode_prompt(own)).count("<|im_start|>system") == 1


def test_a_model_without_a_template_takes_raw_text_and_refuses_always_or_messages(tmp_path):
    from laminar.data.codec import save_tokenizer
    from laminar.tasks.reverse import demo_tokenizer

    save_tokenizer(demo_tokenizer(), tmp_path)
    assert TaskCodec.from_dir(tmp_path).encode_prompt("1 2 =") == [1, 5, 6, 3]  # BOS + tokens
    with pytest.raises(
        ValueError, match=f"data.chat_template=always but the model directory {tmp_path} has no"
    ):
        TaskCodec.from_dir(tmp_path, chat_template="always")
    with pytest.raises(ValueError, match="is a list of chat messages but .* has no chat template"):
        TaskCodec.from_dir(tmp_path).encode_prompt(CHAT)


@pytest.mark.parametrize("style", ["llama3", "chatml"])
def test_every_declared_end_token_ends_a_response_and_the_decode_stops_at_the_first(
    style, llama_dir, chatml_dir
):
    model_dir = llama_dir if style == "llama3" else chatml_dir
    s = REAL_STYLES[style]
    codec = TaskCodec.from_dir(model_dir, stop_token_ids=[7])
    declared = ids_of(codec, s["config_eos"] + s["generation_eos"] + [s["eos"]])
    assert set(codec.end_ids) == {*declared, 7}
    assert set(ModelConfig.from_dir(model_dir).eos_token_ids) == set(
        ids_of(codec, s["config_eos"] + s["generation_eos"])
    )
    answer = codec.tokenizer("The answer is 42.", add_special_tokens=False)["input_ids"]
    for end in codec.end_ids:
        assert codec.decode(answer + [end] + answer) == "The answer is 42."


@pytest.mark.parametrize("style", ["llama3", "chatml"])
def test_a_reward_reads_every_turn_of_a_tool_using_response(style, llama_dir, chatml_dir):
    """A chat template ends the call's turn with an end token: the reward still reads the answer after the tool
    turn, and the tool's output comes in the plain form whatever the template wrapped it in."""
    from laminar.rewards.tool_arith import tool_arith_reward

    codec = TaskCodec.from_dir(llama_dir if style == "llama3" else chatml_dir)
    words = lambda text: codec.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call, tool, answer = (
        words('<tool_call>{"a": 1}</tool_call>'),
        codec.render_tool_output("4517277"),
        words("4517277"),
    )
    end = codec.end_ids[0]
    assert end in tool  # the template's end of the call's turn sits in the rendered tool turn
    ids = call + [end] + tool + answer + [end]
    mask = [1] * (len(call) + 1) + [0] * len(tool) + [1] * (len(answer) + 1)
    text = codec.response_text(ids, mask)
    assert text == '<tool_call>{"a": 1}</tool_call>\n<tool_output>\n4517277\n</tool_output>\n4517277'
    assert codec.decode(ids) == '<tool_call>{"a": 1}</tool_call>'  # what the reward read before: no answer
    assert tool_arith_reward(text, {"answer": "4517277"}) == 1.0
    assert codec.response_text(answer + [end], []) == codec.decode(answer + [end]) == "4517277"


def greedy(engine, prompt, **kw):
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_new_tokens=16, **kw))
    while engine.has_unfinished():
        for f in engine.step().finished:
            return f
    raise AssertionError("the engine finished nothing")


def test_an_end_token_only_generation_config_declares_stops_the_engine(tmp_path):
    model_dir = write_real_model_dir(tmp_path / "m", "llama3")
    prompt = TaskCodec.from_dir(model_dir).encode_prompt(CHAT)
    kw = {"use_cuda_graphs": False, "num_kv_blocks": 16}
    free = greedy(Engine.from_pretrained(model_dir, **kw), prompt, ignore_eos=True).output_token_ids
    stop, other = free[3], free[5]
    declared = set(ModelConfig.from_dir(model_dir).eos_token_ids)
    assert free.index(stop) == 3 and free.index(other) == 5 and not declared & set(free[:6])
    set_generation_eos(model_dir, [stop])  # config.json does not declare it, the tokenizer's EOS is another
    done = greedy(Engine.from_pretrained(model_dir, **kw), prompt)
    assert done.finish_reason == "stop" and done.output_token_ids == free[:4]
    # the tokenizer's EOS and the run's stop tokens reach the engine as `eos_token_ids`
    set_generation_eos(model_dir, [])
    done = greedy(Engine.from_pretrained(model_dir, eos_token_ids=[other], **kw), prompt)
    assert done.finish_reason == "stop" and done.output_token_ids == free[:6]


def test_a_checkpoint_is_a_whole_hugging_face_model_directory(llama_dir, tmp_path):
    trainer = Trainer(TrainerConfig(), str(llama_dir))
    out = trainer.save_checkpoint(tmp_path / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (llama_dir / name).read_bytes(), name
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tokenizer.chat_template == REAL_STYLES["llama3"]["template"]
    model = AutoModelForCausalLM.from_pretrained(str(out))
    for name, p in trainer.model.state_dict().items():
        assert torch.equal(p, model.state_dict()[name]), name
    before, after = TaskCodec.from_dir(llama_dir), TaskCodec.from_dir(out)
    assert after.encode_prompt(CHAT) == before.encode_prompt(CHAT) and after.end_ids == before.end_ids


def test_a_tools_output_is_rendered_through_the_chat_templates_tool_role(chatml_dir, llama_dir):
    """After the model's call: the end of its turn, the tool message, the next assistant prompt; a model with
    no template gets the output between <tool_output> tags."""
    chatml = TaskCodec.from_dir(chatml_dir)
    text = chatml.tokenizer.decode(chatml.render_tool_output("42"))
    assert text.startswith("<|im_end|>") and "42" in text and text.endswith("<|im_start|>assistant\n"), text
    llama = TaskCodec.from_dir(llama_dir)
    text = llama.tokenizer.decode(llama.render_tool_output("42"))
    assert "42" in text and "assistant" in text, text


def test_a_hugging_face_model_is_warm_started_through_its_chat_template(chatml_dir, tmp_path):
    """`laminar warmup --model DIR`: the demonstrations are the chat a rollout reads and writes (the call, then the
    tool's output as the template renders a tool turn, then the answer); only the model's own turns are trained,
    and the directory written keeps the model's tokenizer and template."""
    import random

    from laminar.tasks.tool_arith import call_text
    from laminar.tasks.warmup import WarmupConfig, examples_of, warmup

    codec = TaskCodec.from_dir(chatml_dir)
    ids, mask = examples_of("tool_arith", codec, WarmupConfig(tool_share=1.0))(random.Random(0))
    text = codec.tokenizer.decode(ids)
    trained = codec.tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert "<|im_start|>tool\n" in text and "<|im_start|>tool" not in trained
    assert trained.startswith(call_text("")[: len("<tool_call>")]) and trained.endswith("<|im_end|>")
    out = warmup(
        tmp_path / "warm",
        WarmupConfig(steps=2, batch_size=2, lr=1e-4),
        "tool_arith",
        log=False,
        model_path=chatml_dir,
    )
    again = TaskCodec.from_dir(out)
    assert again.tokenizer.chat_template == codec.tokenizer.chat_template
    assert again.encode_prompt("12*34=") == codec.encode_prompt("12*34=")
    assert json.loads((out / "warmup.json").read_text())["model"] == str(chatml_dir)


@pytest.mark.parametrize("style", ["llama3", "chatml", "demo"])
def test_a_replica_loads_the_class_autotokenizer_chose_and_tokenizes_as_it_does(
    style, llama_dir, chatml_dir, tiny_model_dir
):
    """The driver's codec names AutoTokenizer's class; a replica's codec loaded from that name is the same class
    and gives the same ids, templated text and decoded text (the Qwen2-shaped directory resolves to Qwen2's own
    class through config.json, which a guess from tokenizer_config.json alone would miss)."""
    path = {"llama3": llama_dir, "chatml": chatml_dir, "demo": tiny_model_dir}[style]
    driver = TaskCodec.from_dir(path)
    assert driver.tokenizer_class.startswith("transformers.")
    replica = TaskCodec.from_dir(path, tokenizer_class=driver.tokenizer_class)
    auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert type(replica.tokenizer) is type(auto) is type(driver.tokenizer)
    for text in [
        "What is 12 + 30?",
        " 7 9 1 =",
        "Think step by step. \\boxed{42}\n#### 72",
        "",
        "naïve café ✓",
    ]:
        ids = auto(text)["input_ids"]
        assert replica.tokenizer(text)["input_ids"] == ids
        assert replica.decode(ids) == driver.decode(ids)
        assert replica.tokenizer.decode(ids) == auto.decode(ids)
        if driver.has_template:
            chat = [{"role": "user", "content": text}]
            assert replica.encode_prompt(chat) == driver.encode_prompt(chat)


def test_a_tokenizer_class_that_is_not_transformers_own_is_found_again_by_autotokenizer(llama_dir):
    codec = TaskCodec.from_dir(llama_dir)
    codec.tokenizer.__class__ = type(
        "RemoteTokenizer", (type(codec.tokenizer),), {"__module__": "remote_code"}
    )
    assert codec.tokenizer_class == ""


@pytest.mark.parametrize("style", ["llama3", "chatml", "demo"])
def test_a_replicas_scorer_reads_responses_without_transformers_exactly_as_the_tokenizer_does(
    style, llama_dir, chatml_dir, tiny_model_dir
):
    """`TaskCodec.plain_decoder`, rebuilt from its pickle with the `tokenizers` library alone, decodes every
    response as the codec does: random ids (specials, end tokens and ids past the vocabulary among them) and
    tool-using turns."""
    import pickle
    import random

    path = {"llama3": llama_dir, "chatml": chatml_dir, "demo": tiny_model_dir}[style]
    codec = TaskCodec.from_dir(path, stop_token_ids=[7])
    plain = pickle.loads(pickle.dumps(codec.plain_decoder())).build()
    rng = random.Random(0)
    specials = sorted(set(codec.tokenizer.all_special_ids) | set(codec.end_ids))
    n = codec.vocab_size
    for _ in range(300):
        ids = [
            rng.choice(specials) if rng.random() < 0.1 else rng.randrange(n + 5)
            for _ in range(rng.randrange(40))
        ]
        assert plain.decode(ids) == codec.decode(ids)
        mask = [rng.random() < 0.7 for _ in ids]
        assert plain.response_text(ids, mask) == codec.response_text(ids, mask)
    words = lambda text: codec.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call, tool, answer = words('<tool_call>{"a": 1}</tool_call>'), codec.render_tool_output("42"), words("42")
    end = codec.end_ids[0]
    ids = call + [end] + tool + answer + [end]
    mask = [1] * (len(call) + 1) + [0] * len(tool) + [1] * (len(answer) + 1)
    assert plain.response_text(ids, mask) == codec.response_text(ids, mask)
    if style != "demo":  # the demo's vocabulary has no digits
        assert "\n<tool_output>\n42\n</tool_output>\n" in plain.response_text(ids, mask)


def test_no_plain_decoder_where_the_tokenizer_decodes_otherwise(llama_dir):
    """Cleaning up spaces, or a class of its own that decodes differently: the replica loads the tokenizer."""
    codec = TaskCodec.from_dir(llama_dir)
    assert codec.plain_decoder() is not None
    codec.tokenizer.clean_up_tokenization_spaces = True
    assert codec.plain_decoder() is None
    codec = TaskCodec.from_dir(llama_dir)
    kind = type(codec.tokenizer)
    codec.tokenizer.__class__ = type("Own", (kind,), {"_decode": lambda self, *a, **k: "x"})
    assert codec.plain_decoder() is None


@pytest.mark.parametrize("style", ["llama3", "chatml", "demo"])
def test_the_prompt_pool_encodes_without_transformers_exactly_as_the_codec_does(
    style, llama_dir, chatml_dir, tiny_model_dir
):
    """`TaskCodec.plain_prompt_encoder`, pickled as it travels to the prompt pool and rebuilt there with the
    `tokenizers` library alone, gives raw-text prompts the codec's ids: real byte-level BPE tokenizers (their chat
    templates taken away: with one, transformers renders it) and the demo's."""
    import pickle
    import random

    path = {"llama3": llama_dir, "chatml": chatml_dir, "demo": tiny_model_dir}[style]
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = None
    codec = TaskCodec(tok, source=f"the model directory {path}")
    rng = random.Random(0)
    if style == "demo":  # its vocabulary: digits, spaces and '='
        prompts = [
            " ".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 9))) + " =" for _ in range(50)
        ]
    else:
        specials = sorted(tok.all_special_tokens)
        pieces = ["What is 12 + 30?", "  two leading spaces", "tab\tand\nnewline", "ünïcödé ✓ 你好", "", " "]
        prompts = pieces + [
            " ".join(rng.choice([*pieces, *specials, "x", "12345"]) for _ in range(rng.randrange(1, 6)))
            for _ in range(50)
        ]
    plain = codec.plain_prompt_encoder(prompts[:8])
    assert plain is not None
    plain("warm")  # its tokenizer is built where it is first used, and does not travel
    again = pickle.loads(pickle.dumps(plain))
    assert "_tokenizer" not in again.__dict__
    for prompt in prompts:
        assert again(prompt) == codec.encode_prompt(prompt), prompt
    with pytest.raises(ValueError, match="is a list of chat messages but the model directory .* has no chat"):
        again(CHAT)


def test_no_plain_prompt_encoder_where_a_template_applies_or_the_ids_would_differ(llama_dir):
    """With a chat template, a class of its own that encodes differently, or any of the run's first prompts
    encoded otherwise than the codec does: the prompt pool encodes with the codec itself."""
    assert TaskCodec.from_dir(llama_dir).plain_prompt_encoder() is None
    tok = AutoTokenizer.from_pretrained(llama_dir)
    tok.chat_template = None
    assert TaskCodec(tok).plain_prompt_encoder(["What is 12 + 30?"]) is not None
    differs = TaskCodec(tok)
    differs.encode_prompt = lambda prompt: [0]
    assert differs.plain_prompt_encoder(["What is 12 + 30?"]) is None
    tok.__class__ = type("Own", (type(tok),), {"_encode_plus": lambda self, *a, **k: {"input_ids": [0]}})
    assert TaskCodec(tok).plain_prompt_encoder() is None


@pytest.mark.parametrize("style", ["llama3", "chatml", "demo"])
def test_a_replicas_tool_driver_renders_tool_outputs_without_transformers_as_the_codec_does(
    style, llama_dir, chatml_dir, tiny_model_dir
):
    """`TaskCodec.plain_tool_renderer`, pickled as it travels to a replica's tool driver and rebuilt there with
    the `tokenizers` library alone, gives a tool's output the ids `render_tool_output` gives it: real byte-level
    BPE tokenizers (their chat templates taken away: with one, the template renders the tool turn) and the
    demo's."""
    import pickle
    import random

    path = {"llama3": llama_dir, "chatml": chatml_dir, "demo": tiny_model_dir}[style]
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = None
    codec = TaskCodec(tok)
    plain = codec.plain_tool_renderer()
    assert plain is not None
    plain("warm")  # its tokenizer is built where it is first used, and does not travel
    again = pickle.loads(pickle.dumps(plain))
    assert "_tokenizer" not in again.__dict__
    rng = random.Random(0)
    pieces = [
        "4517277",
        "error: bad input",
        "line\nbreak",
        "\ttab",
        "ünïcödé ✓ 你好",
        " ",
        "= 12 3",
        "<tool_call>",
    ]
    texts = [" ".join(rng.choice(pieces) for _ in range(rng.randrange(0, 5))) for _ in range(100)]
    for text in texts:
        assert again(text) == codec.render_tool_output(text), text


def test_no_plain_tool_renderer_where_a_template_renders_or_the_ids_would_differ(llama_dir):
    """With a chat template (its tool turn), a class of its own that encodes differently, or a checked sample
    rendered otherwise: the replica's tool driver loads the tokenizer."""
    assert TaskCodec.from_dir(llama_dir).plain_tool_renderer() is None
    tok = AutoTokenizer.from_pretrained(llama_dir)
    tok.chat_template = None
    assert TaskCodec(tok).plain_tool_renderer() is not None
    differs = TaskCodec(tok)
    differs.render_tool_output = lambda text: (
        [0] if text == "-3.25" else TaskCodec(tok).render_tool_output(text)
    )
    assert differs.plain_tool_renderer() is None
    tok.__class__ = type("Own", (type(tok),), {"_encode_plus": lambda self, *a, **k: {"input_ids": [0]}})
    assert TaskCodec(tok).plain_tool_renderer() is None
