"""Rows to prompt ids and responses back to text, through the model directory's own Hugging Face tokenizer.

Every model directory, the demo's included, takes one path: `transformers.AutoTokenizer`, on the driver; the
replicas load the class it chose directly (`tokenizer_class`), which is what AutoTokenizer ends in, without its
model registry (about a CPU-second of imports a replica), or, where a reward only reads responses, not even
that: a `ResponseDecoder` over the tokenizer's own decoding state (`TaskCodec.plain_decoder`), without
transformers at all (its import is most of a replica's start); the prompt pool likewise encodes raw-text prompts
through the tokenizer's encoding state (`TaskCodec.plain_prompt_encoder`). A prompt is a string or
a list of `{role, content}` messages; messages go through the tokenizer's chat template with the generation
prompt, and so do strings when the model has a template (`data.chat_template`: auto | always | never). A model
declares its end tokens in several places (config.json, generation_config.json, the tokenizer's EOS); generation
stops on all of them, and the decode a reward sees stops at the first.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from laminar.engine.config import eos_ids

CHAT_TEMPLATE_MODES = ("auto", "always", "never")
ROLES = ("system", "user", "assistant", "tool")
# What makes a model directory's tokenizer whole (slow-tokenizer vocabularies too, where a directory has them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def _json_field(path: Path, name: str) -> Any:
    return json.loads(path.read_text()).get(name) if path.is_file() else None


def declared_end_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The end tokens of config.json and generation_config.json (the engine reads these by itself)."""
    d = Path(model_dir)
    ids = [
        *eos_ids(_json_field(d / "config.json", "eos_token_id")),
        *eos_ids(_json_field(d / "generation_config.json", "eos_token_id")),
    ]
    return tuple(dict.fromkeys(ids))


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Put the tokenizer, its chat template and the generation config of `src` into `dst`, so `dst` is a whole
    Hugging Face model directory; returns the names copied."""
    src, dst = Path(src), Path(dst)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and src.resolve() != dst.resolve():
            shutil.copyfile(src / name, dst / name)
            copied.append(name)
    return copied


def save_tokenizer(tokenizer: Any, out: str | Path) -> None:
    """A Hugging Face tokenizer (`PreTrainedTokenizerFast`) as tokenizer.json plus the small config files
    AutoTokenizer expects, with its own special tokens."""
    out = Path(out)
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    specials = {k: getattr(tokenizer, k) for k in names if getattr(tokenizer, k, None) is not None}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):  # text must decode exactly as written
        cfg["clean_up_tokenization_spaces"] = False
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(specials))


def save_model_dir(model: Any, codec: TaskCodec, out: str | Path) -> Path:
    """A loadable Hugging Face directory: the model, a sampling generation config and the codec's tokenizer."""
    from transformers import GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerationConfig(
        bos_token_id=codec.bos_id,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
        do_sample=True,
        temperature=1.0,
    ).save_pretrained(out)
    save_tokenizer(codec.tokenizer, out)
    return out


class ResponseDecoder:
    """A response's ids to the text a reward reads: `decode` (one turn) and `response_text` (turns and tool
    outputs). `decode_ids(ids, skip_special_tokens)` is the tokenizer's decoding; `tool_frame()` the text a
    rendered tool turn has before and after its output (`TaskCodec.render_tool_output`), asked for once and
    only when a response has a tool turn."""

    def __init__(
        self,
        decode_ids: Callable[[list[int], bool], str],
        end_ids: tuple[int, ...],
        vocab_size: int,
        tool_frame: Callable[[], tuple[str, str]],
    ) -> None:
        self.decode_ids, self.end_ids, self.vocab_size = decode_ids, end_ids, vocab_size
        self._ends = frozenset(end_ids)  # asked of every response a reward reads
        self._frame = tool_frame

    @functools.cached_property
    def tool_frame(self) -> tuple[str, str]:
        return self._frame()

    def decode(self, ids: list[int]) -> str:
        """Text up to (not including) the first end token; special tokens dropped."""
        cut = next((i for i, t in enumerate(ids) if t in self._ends), len(ids))
        n = self.vocab_size
        kept = [i for i in ids[:cut] if 0 <= i < n]  # a random or larger model emits any id
        return self.decode_ids(kept, True)

    def response_text(self, ids: list[int], loss_mask: list[int]) -> str:
        """A multi-turn response as a reward reads it, whatever the chat template: each of the model's turns as
        `decode` gives it (up to its end token), each tool output in between as the plain form,
        `\n<tool_output>\nTEXT\n</tool_output>\n`, with the template's scaffolding (end of turn, tool role, next
        assistant prompt) taken off. `decode` alone would stop at the end token of the first turn."""
        if not loss_mask:
            return self.decode(ids)
        parts: list[str] = []
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or loss_mask[i] != loss_mask[start]:
                span = ids[start:i]
                parts.append(self.decode(span) if loss_mask[start] else self._tool_text(span))
                start = i
        return "".join(parts)

    def _tool_text(self, ids: list[int]) -> str:
        """The tool's output inside a rendered tool turn (`TaskCodec.render_tool_output`), in the plain form."""
        kept = [i for i in ids if 0 <= i < self.vocab_size]  # a random or larger model emits any id
        raw = self.decode_ids(kept, False)
        head, tail = self.tool_frame
        if (
            (head or tail)
            and raw.startswith(head)
            and raw.endswith(tail)
            and len(raw) >= len(head) + len(tail)
        ):
            text = raw[len(head) : len(raw) - len(tail)]
        else:
            text = self.decode_ids(kept, True)
        return plain_tool_output(text.strip())


def no_template_for_messages(source: str) -> str:
    return (
        f"the prompt is a list of chat messages but {source} has no chat template; give plain-string prompts or "
        "a model whose tokenizer has a chat template"
    )


def fast_as_transformers(tok: Any, backend: str, base: str) -> bool:
    """Whether `tok` is a transformers fast tokenizer whose class leaves `backend` as `TokenizersBackend` has it
    and `base` as `PreTrainedTokenizerBase` has it (the call that leads to it): then that encoding or decoding is
    the `tokenizers` backend's, which a process can use without transformers. False on another layout."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: no claim about it
        return False
    kind = type(tok)
    return (
        isinstance(tok, TokenizersBackend)
        and getattr(kind, backend) is getattr(TokenizersBackend, backend)
        and getattr(kind, base) is getattr(PreTrainedTokenizerBase, base)
    )


@dataclasses.dataclass(frozen=True)
class PlainDecoder:
    """What a `ResponseDecoder` needs from a fast tokenizer, made on the driver (`TaskCodec.plain_decoder`) and
    built where responses are scored with the `tokenizers` library alone. `backend`: the tokenizer's decoding
    state as JSON (`tokenizers.Tokenizer.to_str`, as loaded, with the specials transformers added)."""

    backend: str
    end_ids: tuple[int, ...]
    vocab_size: int
    tool_frame: tuple[str, str]

    def build(self) -> ResponseDecoder:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.backend)
        return ResponseDecoder(
            lambda ids, skip: tok.decode(ids, skip_special_tokens=skip),
            self.end_ids,
            self.vocab_size,
            lambda: self.tool_frame,
        )


@dataclasses.dataclass(frozen=True)
class PlainEncoder:
    """A fast tokenizer's encoding with the `tokenizers` library alone, made on the driver and used where
    transformers is never imported (about a CPU-second a process). `backend`: the tokenizer's encoding state as
    JSON (`tokenizers.Tokenizer.to_str`); `split_special_tokens`: transformers' setting of the same name. The
    fields travel; the tokenizer is built from them where it is first used."""

    backend: str
    split_special_tokens: bool

    @functools.cached_property
    def _tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.backend)
        tok.no_truncation()  # what a plain `tokenizer(text)` sets before it encodes
        tok.no_padding()
        tok.encode_special_tokens = self.split_special_tokens
        return tok

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_tokenizer"}

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


@dataclasses.dataclass(frozen=True)
class PlainPromptEncoder(PlainEncoder):
    """`TaskCodec.encode_prompt` for a tokenizer without a chat template (`TaskCodec.plain_prompt_encoder`), for
    the prompt pool. `source`: what names the tokenizer in an error."""

    source: str

    def __call__(self, prompt: str | list[dict[str, str]]) -> list[int]:
        if not isinstance(prompt, str):
            raise ValueError(no_template_for_messages(self.source))
        return self.encode(prompt, add_special_tokens=True)


@dataclasses.dataclass(frozen=True)
class PlainToolRenderer(PlainEncoder):
    """`TaskCodec.render_tool_output` for a tokenizer without a chat template (`plain_tool_output`'s text, encoded
    without specials; `TaskCodec.plain_tool_renderer`), for the replicas' tool drivers."""

    def __call__(self, text: str) -> list[int]:
        return self.encode(plain_tool_output(text), add_special_tokens=False)


def plain_tool_output(text: str) -> str:
    """A tool's output in the plain form (no chat template): between <tool_output> tags on lines of their own."""
    return f"\n<tool_output>\n{text}\n</tool_output>\n"


# What the plain renderer is checked on before a run uses it: numbers, errors, lines, spaces, non-ASCII, the tags.
TOOL_OUTPUT_SAMPLES = (
    "4517277",
    "-3.25",
    "",
    "error: ZeroDivisionError: division by zero",
    'Traceback (most recent call last):\n  File "<tool>", line 1\n    x = (\n        ^',
    "  two leading spaces and a trailing one ",
    "naïve café → ∑ 東京 🙂",
    "</tool_output> <tool_output>",
)


class TaskCodec:
    """Encodes a row's prompt to ids and decodes a response to text, for one model's tokenizer.

    `end_ids`: every token that ends a response (the model's declared ends, the tokenizer's EOS and
    `rollout.stop_token_ids`); the engine stops on all of them and `decode` cuts at the first."""

    def __init__(
        self,
        tokenizer: Any,
        end_ids: Iterable[int] = (),
        chat_template: str = "auto",
        system_prompt: str = "",
        source: str = "the tokenizer",
    ) -> None:
        if chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(
                f"data.chat_template={chat_template!r} is invalid: {' | '.join(CHAT_TEMPLATE_MODES)}"
            )
        self.tokenizer = tokenizer
        self.source = source
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template == "always" and not self.has_template:
            raise ValueError(
                f"data.chat_template=always but {source} has no chat template (no chat_template in "
                "tokenizer_config.json, no chat_template.jinja); use auto or never, or a model that has one"
            )
        self.template_strings = self.has_template and chat_template != "never"
        self.system_prompt = system_prompt
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self.end_ids = tuple(dict.fromkeys([*eos, *end_ids]))
        self.responses = ResponseDecoder(
            lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip),
            self.end_ids,
            len(tokenizer),
            self._tool_frame,
        )

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        chat_template: str = "auto",
        system_prompt: str = "",
        stop_token_ids: Iterable[int] = (),
        tokenizer_class: str = "",
    ) -> TaskCodec:
        """The tokenizer of a local model directory (never a download). `tokenizer_class`: the class
        AutoTokenizer chose for this directory (`TaskCodec.tokenizer_class` of a codec loaded without it), to
        load it again without AutoTokenizer's resolution."""
        if tokenizer_class:
            module, name = tokenizer_class.split(":")
            loader = getattr(importlib.import_module(module), name)
        else:
            from transformers import AutoTokenizer as loader
        try:
            tokenizer = loader.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"model directory {path}: its tokenizer does not load ({str(e).splitlines()[0]}); expected "
                "tokenizer.json and tokenizer_config.json (a fast Hugging Face tokenizer)"
            ) from e
        return cls(
            tokenizer,
            [*declared_end_ids(path), *stop_token_ids],
            chat_template,
            system_prompt,
            source=f"the model directory {path}",
        )

    @property
    def tokenizer_class(self) -> str:
        """`module:name` of the tokenizer's class for `from_dir`, or "" where it is not one of transformers' own
        (a model's remote code: AutoTokenizer is needed to find it again)."""
        kind = type(self.tokenizer)
        return f"{kind.__module__}:{kind.__qualname__}" if kind.__module__.startswith("transformers.") else ""

    @classmethod
    def from_config(cls, path: str | Path, cfg: Any) -> TaskCodec:
        """The run's codec: the model directory's tokenizer with the `data` and `rollout` settings."""
        return cls.from_dir(path, cfg.data.chat_template, cfg.data.system_prompt, cfg.rollout.stop_token_ids)

    # ---- prompts ------------------------------------------------------------------------------------------
    def messages(self, prompt: str | list[dict[str, str]]) -> list[dict[str, str]] | None:
        """The chat a prompt becomes, or None when it is encoded as raw text."""
        if isinstance(prompt, str):
            if not self.template_strings:
                return None
            chat = [{"role": "user", "content": prompt}]
        else:
            if not self.has_template:
                raise ValueError(no_template_for_messages(self.source))
            chat = [{"role": m["role"], "content": m["content"]} for m in prompt]
        if self.system_prompt and chat[0]["role"] != "system":
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat

    def prompt_text(self, prompt: str | list[dict[str, str]]) -> str:
        """What the model reads, as text: the templated chat with the generation prompt, or the string itself."""
        chat = self.messages(prompt)
        if chat is None:
            return prompt
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    def encode_prompt(self, prompt: str | list[dict[str, str]]) -> list[int]:
        chat = self.messages(prompt)
        if chat is None:  # raw text: the tokenizer adds its own specials (the demo's and Llama's BOS)
            return list(self.tokenizer(prompt)["input_ids"])
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        # the template wrote BOS (if the model has one) itself: adding specials again would double it
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _plain_encoding(self) -> tuple[str, bool] | None:
        """`PlainEncoder`'s fields where raw text encodes exactly as the fast tokenizer's backend encodes it: no
        chat template, and a class that encodes as transformers' `TokenizersBackend` does. Else None."""
        tok = self.tokenizer
        if self.has_template or not fast_as_transformers(tok, backend="_encode_plus", base="__call__"):
            return None
        return tok.backend_tokenizer.to_str(), bool(tok.split_special_tokens)

    def plain_prompt_encoder(
        self, prompts: Iterable[str | list[dict[str, str]]] = ()
    ) -> PlainPromptEncoder | None:
        """This codec's `encode_prompt` without transformers, where the tokenizer has no chat template (every
        prompt is raw text) and its class encodes as transformers' `TokenizersBackend` does; checked to give the
        same ids as `encode_prompt` on `prompts` (a run's first rows). Else None: the codec itself encodes."""
        state = self._plain_encoding()
        if state is None:
            return None
        plain = PlainPromptEncoder(*state, self.source)
        for prompt in prompts:
            try:
                if isinstance(prompt, str) and plain(prompt) != self.encode_prompt(prompt):
                    return None
            except Exception:  # noqa: BLE001 - a row the codec cannot encode: the pool names it, as ever
                return None
        return plain

    def encode_answer(self, answer: str) -> list[int]:
        """A supervised target: the answer's tokens and EOS (the demo's warm-up)."""
        return [*self.tokenizer(answer, add_special_tokens=False)["input_ids"], self.eos_id]

    # ---- responses ----------------------------------------------------------------------------------------
    def render_tool_output(self, text: str) -> list[int]:
        """A tool's output as the context tokens that follow the model's call. With a chat template: what the
        template puts after an assistant turn, the tool message (its tool role) and the next assistant prompt.
        Without one: the text between <tool_output> tags on lines of their own."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "CALL"}]
            try:
                before = tok.apply_chat_template(base, tokenize=False)
                after = tok.apply_chat_template(
                    [*base, {"role": "tool", "content": text}], tokenize=False, add_generation_prompt=True
                )
            except Exception:  # noqa: BLE001 - a template without a tool role: the plain form below
                before = after = ""
            cut = before.rfind("CALL") + len("CALL")
            if cut >= len("CALL") and after.startswith(before[:cut]):
                return list(tok(after[cut:], add_special_tokens=False)["input_ids"])
        return list(tok(plain_tool_output(text), add_special_tokens=False)["input_ids"])

    def plain_tool_renderer(self) -> PlainToolRenderer | None:
        """This codec's `render_tool_output` without transformers, where the tokenizer has no chat template and
        its class encodes as transformers' `TokenizersBackend` does; checked to give the same ids on
        `TOOL_OUTPUT_SAMPLES`. Else None: a replica's tool driver loads the tokenizer."""
        state = self._plain_encoding()
        if state is None:
            return None
        plain = PlainToolRenderer(*state)
        if any(plain(text) != self.render_tool_output(text) for text in TOOL_OUTPUT_SAMPLES):
            return None
        return plain

    def response_text(self, ids: list[int], loss_mask: list[int]) -> str:
        return self.responses.response_text(ids, loss_mask)

    def decode(self, ids: list[int]) -> str:
        return self.responses.decode(ids)

    def _tool_frame(self) -> tuple[str, str]:
        """A rendered tool turn's text before and after the output (empty when a marker does not survive)."""
        marker = "TOOLTEXT"
        head, sep, tail = self.tokenizer.decode(
            self.render_tool_output(marker), skip_special_tokens=False
        ).partition(marker)
        return (head, tail) if sep else ("", "")

    def plain_decoder(self) -> PlainDecoder | None:
        """This codec's `decode` and `response_text` as a `PlainDecoder`, where they are exactly the fast
        tokenizer's own decoding: its class decodes as transformers' `TokenizersBackend` does (no override) and
        cleans up no spaces. Else None (the replica loads the tokenizer itself)."""
        tok = self.tokenizer
        if (
            not fast_as_transformers(tok, backend="_decode", base="decode")
            or tok.clean_up_tokenization_spaces
        ):
            return None
        return PlainDecoder(
            tok.backend_tokenizer.to_str(), self.end_ids, self.vocab_size, self.responses.tool_frame
        )

    # ---- the tokenizer's specials -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.end_ids[0]

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_id
