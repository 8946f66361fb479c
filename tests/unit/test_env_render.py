"""Multi-turn rendering is append-only: the trajectory's ids (opening, sampled turns verbatim,
replies) always decode to the chat template's rendering of the conversation; a template that
rewrites an earlier turn is refused (AppendError); the built-in tokenizer renders contents; a reply
that cannot fit in the tokens left is refused (TooLong) without being tokenized."""
import shutil

import pytest

from orchestrator.config import TaskConfig
from orchestrator.data.tokens import load_tokens
from orchestrator.envs.render import AppendError, TooLong, TurnRenderer

pytest.importorskip("transformers")

USER = [{"role": "user", "content": "look up 47"}]


def _enc(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture()
def chat(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    return tokens, TurnRenderer(tokens, TaskConfig())


def _turn(tok, text, stop=True):
    return _enc(tok, text) + ([tok.convert_tokens_to_ids("<|im_end|>")] if stop else [])


@pytest.mark.parametrize("stopped", [True, False])
def test_chat_trajectory_decodes_to_the_templates_rendering(chat, stopped):
    tokens, r = chat
    tok = tokens.tokenizer
    ids, state = r.opening(USER)
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(
        USER, tokenize=False, add_generation_prompt=True)
    history = list(USER)
    for text, reply in [("call 47", "= 83"), ("call 12", "= 05")]:
        turn = _turn(tok, text, stopped)          # sampled ids: kept verbatim, never re-encoded
        history.append({"role": "assistant", "content": text})
        msgs = [{"role": "tool", "content": reply}]
        new = r.reply(state, history, turn, msgs)
        history += msgs
        ids = ids + turn + new
        assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(
            history, tokenize=False, add_generation_prompt=True)
    assert ids[:len(r.opening(USER)[0])] == r.opening(USER)[0]


def test_system_prompt_goes_first(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    r = TurnRenderer(tokens, TaskConfig(system_prompt="be brief"))
    ids, _ = r.opening(USER)
    assert tokens.tokenizer.decode(ids, skip_special_tokens=False).startswith(
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nlook up 47")


def test_a_template_that_rewrites_history_is_refused(hf_model_dir, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(hf_model_dir, d)
    tokens = load_tokens(str(d))
    tok = tokens.tokenizer          # like a reasoning template: earlier turns lose their thinking
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('|')[-1] }}"
        "{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    r = TurnRenderer(tokens, TaskConfig())
    ids, state = r.opening(USER)
    plain = USER + [{"role": "assistant", "content": "call 47"}]       # nothing to strip: appends
    r.reply(state, plain, _turn(tok, "call 47"), [{"role": "tool", "content": "= 83"}])
    plain += [{"role": "tool", "content": "= 83"}, {"role": "assistant", "content": "hmm|call 12"}]
    with pytest.raises(AppendError, match="rewrites the conversation"):
        r.reply(state, plain, _turn(tok, "hmm|call 12"), [{"role": "tool", "content": "= 05"}])


def test_builtin_tokenizer_renders_contents():
    tokens = load_tokens(None)
    tok = tokens.tokenizer
    r = TurnRenderer(tokens, TaskConfig())
    ids, state = r.opening([{"role": "user", "content": "47>"}])
    assert ids == list(tok("47>")["input_ids"]) and ids[0] == tok.bos_token_id
    reply = r.reply(state, [], [0], [{"role": "tool", "content": "=83>"}])
    assert tok.decode(reply) == "=83>"


@pytest.mark.parametrize("bad", [None, [{"role": "user"}], [{"role": "user", "content": 3}], "text"])
def test_malformed_messages_are_a_type_error(bad):
    r = TurnRenderer(load_tokens(None), TaskConfig())
    with pytest.raises(TypeError, match="role"):
        r.opening(bad)


class _Counting:
    """The real tokenizer, recording the length of every text it encodes."""

    def __init__(self, tok):
        self._tok, self.seen = tok, []

    def __call__(self, text, **kw):
        self.seen.append(len(text))
        return self._tok(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.mark.parametrize("model", ["hf", "builtin"])
def test_a_reply_that_cannot_fit_is_refused_before_it_is_tokenized(model, request):
    base = load_tokens(str(request.getfixturevalue("hf_model_dir")) if model == "hf" else None)
    counting = _Counting(base.tokenizer)
    r = TurnRenderer(type(base)(counting, base.stop_ids, base.pad_id), TaskConfig())
    opening = USER if model == "hf" else [{"role": "user", "content": "47>"}]
    ids, state = r.opening(opening, budget=50)
    huge = [{"role": "tool", "content": "7" * 1_000_000}]
    turn = _enc(base.tokenizer, "12")
    history = [*opening, {"role": "assistant", "content": "12"}]
    with pytest.raises(TooLong, match="cannot fit in 40 tokens"):
        r.reply(state, history, turn, huge, budget=40)
    assert max(counting.seen) <= 40 * r.max_token_chars < 1_000_000      # never tokenized whole
    small = [{"role": "tool", "content": "= 83"}]                        # what fits still appends
    assert r.reply(state, history, turn, small, budget=40)
