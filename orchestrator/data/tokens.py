"""The model's tokens: tokenizer, stop ids, pad id, and prompt rendering (chat template or plain).

Contract:
- `load_tokens(model_path) -> ModelTokens`: with a local HF directory, its tokenizer
  (`AutoTokenizer`, local files only), its stop ids (every `eos_token_id` of generation_config.json,
  an int or a list, plus the tokenizer's eos) and its pad id (the tokenizer's, else the first stop
  id). Without one, the built-in character tokenizer (stop: its eos).
- `build_tokenizer(task_name, path=None)`: with no `path`, the offline character tokenizer
  (`CharTokenizer`: a small fixed vocabulary, `VOCAB`: pad, bos, eos, digits, a few symbols; a text
  is bos + one id per character), answered by `tokenizers` alone and equal to transformers'
  `PreTrainedTokenizerFast` over it (which it hands every other call to); the same vocabulary for
  every task, so ids never depend on the task. With `path`, the tokenizer of that local HF
  directory (never downloads).
  `quiet_hf()` keeps transformers' bars and warnings off the console while loading or saving.
- `PromptRenderer(tokens, task_cfg)`: `ids(value) -> int32 array`. A list of chat messages
  ({role, content} mappings) is rendered with the tokenizer's chat template and the generation
  prompt, a `task.system_prompt` turn first unless the messages start with one. A plain string is
  wrapped as one user turn when `task.apply_chat_template` is true (`auto`: when the tokenizer has a
  chat template; `chat` says whether it has), else tokenized as given (with the tokenizer's own
  special tokens, e.g. a leading bos). Anything else raises `DataError`. A prompt with characters
  the tokenizer has no token for (ids equal to its unknown id: `<pad>` for the built-in one) raises
  `DataError` naming them (`task.unknown_chars=error`), or is counted in `unknown_prompts` and
  `unknown_seen` (`warn`). Rendered text is tokenized once; the ids are what the engine sees and
  what the trainer trains on.
- `rendering_line(task_cfg, chat)`: the start-up line that says how plain-string prompts are
  rendered when `task.apply_chat_template=auto` decided it.
- `completion_text(tokens, ids)`: the text a reward sees: the completion without its final stop
  token, decoded without special tokens.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np


class DataError(ValueError):
    """Bad workload input (dataset, prompt, reward spec); one line naming it; the launch exits 2."""


PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
VOCAB = [PAD, BOS, EOS, *"0123456789", "+", "-", "=", ">", "|", " "]


@contextlib.contextmanager
def quiet_hf():
    """No transformers progress bars or warnings (loading or writing a model or tokenizer) on the
    console: what goes wrong is raised, and reported as one line by the caller."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def build_tokenizer(task_name: str = "", path: Optional[str] = None):
    """Offline tokenizer. `task_name` is accepted for symmetry; every built-in task shares VOCAB.
    The built-in one is a `CharTokenizer`, which imports no transformers (a launch validates its
    input without it, and a supervisor never pays its import)."""
    if path is not None:
        from transformers import AutoTokenizer
        with quiet_hf():
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
    return CharTokenizer()


def _char_tokenizer():
    """The built-in vocabulary as a `tokenizers.Tokenizer`: one token per character, pad/bos/eos
    kept whole (and special: decoding can skip them), a text starts with bos."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.add_special_tokens([PAD, BOS, EOS])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[a-z]+>|."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB.index(BOS))])
    tok.decoder = decoders.Fuse()          # characters join without spaces
    return tok


class Encoded(dict):
    """What a tokenizer call returns: `enc["input_ids"]` or `enc.input_ids`, as transformers'
    BatchEncoding answers both."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class CharTokenizer:
    """The built-in character tokenizer with the slice of transformers' tokenizer API the runtime
    calls (`tok(text, add_special_tokens=True)["input_ids"]`, `decode(ids, skip_special_tokens)`,
    `get_vocab()`, `len`, the pad/bos/eos ids, `chat_template` None), answered by `tokenizers`
    alone. Anything else (`save_pretrained`, `convert_ids_to_tokens`, ...) goes to the equivalent
    `PreTrainedTokenizerFast` over the same `tokenizers.Tokenizer` (`hf()`), built on first use:
    transformers is imported only where such a call is made (export, a worker that saves a model).
    `tests/unit/test_tokens.py` checks both give the same ids, text and attributes."""

    chat_template = None

    def __init__(self) -> None:
        self._tok = _char_tokenizer()
        self._hf = None
        self.pad_token_id, self.bos_token_id, self.eos_token_id = (VOCAB.index(t) for t in (PAD, BOS, EOS))
        self.pad_token, self.bos_token, self.eos_token = PAD, BOS, EOS
        self.unk_token, self.unk_token_id = PAD, self.pad_token_id      # what an unknown character becomes

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        if not isinstance(text, str):
            return self.hf()(text, add_special_tokens=add_special_tokens)
        return Encoded(input_ids=self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict:
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def hf(self):
        """The same tokenizer as transformers' `PreTrainedTokenizerFast` (imports transformers)."""
        if self._hf is None:
            from transformers import PreTrainedTokenizerFast
            self._hf = PreTrainedTokenizerFast(tokenizer_object=self._tok, pad_token=PAD, bos_token=BOS,
                                               eos_token=EOS, unk_token=PAD,
                                               clean_up_tokenization_spaces=False)
        return self._hf

    def __getattr__(self, name: str):
        if name.startswith("_"):           # pickling and copying look up dunders before __init__ ran
            raise AttributeError(name)
        return getattr(self.hf(), name)

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


@dataclass(frozen=True)
class ModelTokens:
    tokenizer: object
    stop_ids: tuple[int, ...]
    pad_id: int

    @property
    def eos_id(self) -> int:
        return self.stop_ids[0]


def _generation_eos(model_path: str) -> list[int]:
    path = os.path.join(model_path, "generation_config.json")
    if not os.path.exists(path):
        return []
    try:
        with open(path, "rb") as f:
            eos = json.loads(f.read().decode("utf-8")).get("eos_token_id")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise DataError(f"model.path: cannot read {path} ({type(exc).__name__})") from None
    eos = [eos] if isinstance(eos, int) else eos
    if eos is None:
        return []
    if not isinstance(eos, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
        raise DataError(f"model.path: eos_token_id in {path} is neither an int nor a list of ints")
    return eos


def load_tokens(model_path: Optional[str]) -> ModelTokens:
    tok = build_tokenizer(path=model_path)
    stops: list[int] = []
    if model_path is not None:
        stops = _generation_eos(model_path)
    if tok.eos_token_id is not None and tok.eos_token_id not in stops:
        stops.append(int(tok.eos_token_id))
    if not stops:
        raise DataError(f"model.path={model_path}: neither generation_config.json nor the tokenizer "
                        f"names an eos token (generation could never stop)")
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    return ModelTokens(tok, tuple(int(s) for s in stops), int(pad))


def completion_text(tokens: ModelTokens, ids) -> str:
    ids = [int(t) for t in ids]
    if ids and ids[-1] in tokens.stop_ids:
        ids = ids[:-1]
    return tokens.tokenizer.decode(ids, skip_special_tokens=True)


def rendering_line(task_cfg, chat: bool) -> Optional[str]:
    if task_cfg.apply_chat_template != "auto":
        return None
    if chat:
        return ("task.apply_chat_template=auto: plain-string prompts are rendered as one user turn "
                "with the tokenizer's chat template (false: tokenized as given)")
    return ("task.apply_chat_template=auto: the tokenizer has no chat template, plain-string prompts "
            "are tokenized as given")


def unknown_chars(tok, text: str, ids) -> tuple[str, ...]:
    """The pieces of `text` (characters, or words for a word-level tokenizer) that `tok` turned into
    its unknown token, sorted and each once (empty when none)."""
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or int(unk) not in {int(t) for t in ids}:
        return ()
    if isinstance(tok, CharTokenizer):
        known = set(tok.get_vocab())
        chars = {c for c in text if c not in known}
    else:
        try:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            chars = {text[a:b] for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
                     if int(t) == int(unk)}
        except (TypeError, ValueError, KeyError, NotImplementedError):    # a slow tokenizer: no offsets
            chars = {f"<{sum(int(t) == int(unk) for t in ids)} unknown tokens>"}
    return tuple(sorted(chars))


class PromptRenderer:
    def __init__(self, tokens: ModelTokens, task_cfg):
        self.tok = tokens.tokenizer
        self.system = task_cfg.system_prompt
        self.chat = bool(getattr(self.tok, "chat_template", None))
        wrap = task_cfg.apply_chat_template
        self.wrap = self.chat if wrap == "auto" else bool(wrap)
        self.field = task_cfg.prompt_field
        self.on_unknown = task_cfg.unknown_chars
        self.unknown_prompts, self.unknown_seen = 0, set()
        if (self.wrap or self.system is not None) and not getattr(self.tok, "chat_template", None):
            what = "task.system_prompt" if self.system is not None else "task.apply_chat_template"
            raise DataError(f"{what} needs a chat template, and the tokenizer of model.path has none")

    def _messages(self, value: list) -> list[dict]:
        msgs = []
        for m in value:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise DataError(f"field '{self.field}': a chat message must be a mapping with string "
                                f"'role' and 'content', got {str(m)[:80]!r}")
            msgs.append({"role": m["role"], "content": m["content"]})
        if not msgs:
            raise DataError(f"field '{self.field}': an empty list of chat messages")
        if self.system is not None and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": self.system})
        return msgs

    def ids(self, value) -> np.ndarray:
        if isinstance(value, str):
            if not self.wrap:
                if self.system is not None:
                    raise DataError("task.system_prompt with plain-string prompts needs "
                                    "task.apply_chat_template: true")
                return self._known(value, np.asarray(self.tok(value)["input_ids"], dtype=np.int32))
            value = [{"role": "user", "content": value}]
        if not isinstance(value, list):
            raise DataError(f"field '{self.field}' holds a {type(value).__name__}, not a string or a "
                            f"list of chat messages")
        if not getattr(self.tok, "chat_template", None):
            raise DataError(f"field '{self.field}' holds chat messages, and the tokenizer of "
                            f"model.path has no chat template")
        text = self.tok.apply_chat_template(self._messages(value), tokenize=False,
                                            add_generation_prompt=True)
        return self._known(text, np.asarray(self.tok(text, add_special_tokens=False)["input_ids"],
                                            dtype=np.int32))

    def _known(self, text: str, ids: np.ndarray) -> np.ndarray:
        chars = unknown_chars(self.tok, text, ids)
        if chars:
            if self.on_unknown == "error":
                shown = ", ".join(repr(c) for c in chars[:20]) + (", ..." if len(chars) > 20 else "")
                raise DataError(f"characters the tokenizer has no token for: {shown} (they would "
                                f"train as {self.tok.unk_token!r}; task.unknown_chars=warn trains "
                                f"them so)")
            self.unknown_prompts += 1
            self.unknown_seen.update(chars)
        return ids
