"""Messages -> token ids for multi-turn episodes, append-only.

Contract: `TurnRenderer(tokens, task_cfg)`. Per episode, `opening(messages, tools) -> (ids, state)`
renders the environment's opening messages with the generation prompt; `reply(state, history,
turn_ids, reply) -> ids` returns the ids to append after the model's turn `turn_ids` (sampled,
verbatim) so that the engine's next prompt is the conversation `history` (the model's turns as
`assistant` messages of their decoded text) plus `reply`, ending with the generation prompt. Ids are
only ever appended: nothing already in the trajectory is re-encoded.
- With a chat template (an HF tokenizer that has one): the template renders the whole conversation
  as text; the text of the trajectory so far (the opening's rendering, then each sampled turn decoded
  with its special tokens, then each reply's text) must be a prefix of that rendering, and the new
  ids are the tokenization of the rest. A template that rewrites earlier turns (drops a reasoning
  block, reformats a tool call) or a turn whose decoding differs from the template's rendering of
  it breaks the prefix: `AppendError` (the runner ends the episode and counts it). `task.system_prompt`
  goes first unless the opening has a system message; `tools` (the environment's) go to the template.
- Without one (the built-in character tokenizer): a message is its content; the opening is the
  tokenizer's encoding of the contents (bos included), a reply the encoding of its contents.
Both take `budget`, the tokens the episode has left: a text to encode longer than `budget` times
the longest token's characters (`max_token_chars`, from the vocabulary) cannot fit and raises
`TooLong` before anything is tokenized, so a huge reply costs a string comparison, not a
tokenization. The ids of a text that passes may still exceed `budget` (the runner checks them).
Calls on one renderer must not overlap (the runner renders on one thread): HF tokenizers are not
safe for concurrent calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.data.tokens import DataError, ModelTokens


class AppendError(ValueError):
    """The environment's reply cannot be appended without rewriting the trajectory."""


class TooLong(ValueError):
    """The text to append cannot fit in the tokens left (found before tokenizing it)."""


@dataclass
class RenderState:
    text: str = ""                 # the trajectory so far as text (chat templates only)
    tools: Optional[list] = None


class TurnRenderer:
    def __init__(self, tokens: ModelTokens, task_cfg):
        self.tok = tokens.tokenizer
        self.chat = bool(getattr(self.tok, "chat_template", None))
        self.system = task_cfg.system_prompt
        self.max_token_chars = max(1, max(map(len, self.tok.get_vocab()), default=1))
        if self.system is not None and not self.chat:
            raise DataError("task.system_prompt needs a chat template, and the tokenizer of "
                            "model.path has none")

    def _encode(self, text: str, budget: Optional[int], specials: bool = False) -> list[int]:
        if budget is not None and len(text) > budget * self.max_token_chars:
            raise TooLong(f"{len(text)} characters cannot fit in {budget} tokens (at most "
                          f"{self.max_token_chars} characters a token)")
        return [int(t) for t in self.tok(text, add_special_tokens=specials)["input_ids"]]

    def _render(self, messages: list[dict], tools) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                            add_generation_prompt=True)

    def _messages(self, messages: list[dict]) -> list[dict]:
        if self.system is not None and (not messages or messages[0].get("role") != "system"):
            return [{"role": "system", "content": self.system}, *messages]
        return list(messages)

    def opening(self, messages: list[dict], tools: Optional[list] = None,
                budget: Optional[int] = None) -> tuple[list[int], RenderState]:
        _check(messages, "the opening")
        if not messages:
            raise AppendError("reset() returned no messages")
        if not self.chat:
            return self._encode("".join(m["content"] for m in messages), budget, specials=True), RenderState()
        text = self._render(self._messages(messages), tools)
        return self._encode(text, budget), RenderState(text, tools)

    def reply(self, state: RenderState, history: list[dict], turn_ids: list[int],
              reply: list[dict], budget: Optional[int] = None) -> list[int]:
        _check(reply, "a reply")
        if not self.chat:
            return self._encode("".join(m["content"] for m in reply), budget)
        so_far = state.text + self.tok.decode(turn_ids, skip_special_tokens=False)
        full = self._render(self._messages([*history, *reply]), state.tools)
        if not full.startswith(so_far):
            at = next((i for i, (a, b) in enumerate(zip(so_far, full)) if a != b), len(full))
            raise AppendError(f"the chat template rewrites the conversation at character {at} "
                              f"({so_far[at:at + 24]!r} became {full[at:at + 24]!r})")
        rest = full[len(so_far):]
        ids = self._encode(rest, budget)
        if self.tok.decode(ids, skip_special_tokens=False) != rest:
            raise AppendError(f"the reply's text {rest[:40]!r} does not survive tokenization")
        state.text = full
        return ids


def _check(messages, what: str) -> None:
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise TypeError(f"{what} must be a list of messages with string 'role' and 'content', got "
                        f"{str(messages)[:80]!r}")
