"""The model's tokens (orchestrator.data.tokens) from a real HF model directory: stop ids from the
generation config, chat rendering with the model's template, plain strings as given or wrapped, and
the round trip sampled ids -> rollout record -> ring codec -> trainer batch, byte for byte."""
import numpy as np
import pytest

from orchestrator.config import TaskConfig
from orchestrator.data.tokens import DataError, PromptRenderer, completion_text, load_tokens

pytest.importorskip("transformers")


def _task(**kw):
    return TaskConfig(name="dataset", dataset="unused.jsonl", reward="exact_match", **kw)


def test_stop_ids_are_every_eos_of_the_generation_config(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    tok = tokens.tokenizer
    assert set(tokens.stop_ids) == {tok.convert_tokens_to_ids("<|im_end|>"),
                                    tok.convert_tokens_to_ids("<|endoftext|>")}
    assert tokens.pad_id == tok.convert_tokens_to_ids("<|endoftext|>")
    builtin = load_tokens(None)
    assert builtin.stop_ids == (builtin.tokenizer.eos_token_id,)


def test_chat_messages_render_with_the_template_and_generation_prompt(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    r = PromptRenderer(tokens, _task(system_prompt="Be brief."))
    ids = r.ids([{"role": "user", "content": "copy 47"}])
    assert ids.dtype == np.int32
    assert tokens.tokenizer.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                            "<|im_start|>user\ncopy 47<|im_end|>\n<|im_start|>assistant\n")
    own = r.ids([{"role": "system", "content": "Mine."}, {"role": "user", "content": "x"}])
    assert tokens.tokenizer.decode(own).count("system") == 1 and "Mine." in tokens.tokenizer.decode(own)


def test_plain_strings_as_given_or_wrapped(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    plain = PromptRenderer(tokens, _task(apply_chat_template=False)).ids("copy the digits")
    assert plain.tolist() == tokens.tokenizer("copy the digits")["input_ids"]
    turn = "<|im_start|>user\ncopy the digits<|im_end|>\n<|im_start|>assistant\n"
    for wrap in (True, "auto"):                 # auto, the default: the template, since it has one
        wrapped = PromptRenderer(tokens, _task(apply_chat_template=wrap)).ids("copy the digits")
        assert tokens.tokenizer.decode(wrapped) == turn
    assert _task().apply_chat_template == "auto"
    builtin = PromptRenderer(load_tokens(None), _task())      # no template: auto is as given
    assert not builtin.wrap and builtin.ids("12").tolist() == load_tokens(None).tokenizer("12")["input_ids"]


def test_characters_without_a_token_are_named_or_counted():
    tokens = load_tokens(None)                  # the built-in tokenizer: digits and a few marks
    with pytest.raises(DataError, match=r"no token for: 'a', 'd'.*task.unknown_chars=warn"):
        PromptRenderer(tokens, _task()).ids("add 12")
    warn = PromptRenderer(tokens, _task(unknown_chars="warn"))
    ids = warn.ids("add 12")
    assert ids.tolist().count(tokens.tokenizer.unk_token_id) == 3
    assert (warn.unknown_prompts, warn.unknown_seen) == (1, {"a", "d"})
    warn.ids("12")
    assert warn.unknown_prompts == 1


def test_an_hf_tokenizer_with_an_unknown_token_names_what_it_lost(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "copy": 1, "12": 2, "</s>": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]",
                                   eos_token="</s>")
    fast.save_pretrained(tmp_path)
    tokens = load_tokens(str(tmp_path))
    assert PromptRenderer(tokens, _task()).ids("copy 12").tolist() == [1, 2]
    with pytest.raises(DataError, match="no token for: 'banana'"):
        PromptRenderer(tokens, _task()).ids("copy banana 12")


@pytest.mark.parametrize("value, needle", [
    (3, "int"), ([], "empty"), ([{"role": "user"}], "'role' and 'content'"),
])
def test_bad_prompt_values_are_data_errors(hf_model_dir, value, needle):
    with pytest.raises(DataError, match=needle):
        PromptRenderer(load_tokens(str(hf_model_dir)), _task()).ids(value)


def test_chat_needs_a_template():
    with pytest.raises(DataError, match="chat template"):
        PromptRenderer(load_tokens(None), _task(system_prompt="x"))
    with pytest.raises(DataError, match="chat template"):
        PromptRenderer(load_tokens(None), _task()).ids([{"role": "user", "content": "x"}])


def test_completion_text_drops_the_final_stop_and_special_tokens(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    tok = tokens.tokenizer
    ids = tok("the answer is 42", add_special_tokens=False)["input_ids"]
    assert completion_text(tokens, ids + [tokens.stop_ids[0]]) == "the answer is 42"
    assert completion_text(tokens, ids) == "the answer is 42"


def test_sampled_ids_reach_the_trainer_byte_for_byte(hf_model_dir):
    """Chat prompts (special tokens, multi-token template text) -> TorchInference samples ->
    rollout record -> encode/decode (the ring codec) -> batch -> the trainer's padded ids: equal,
    and the trainer's recomputed logprobs match the sampled ones (same ids, same positions)."""
    from orchestrator.backends.base import GenRequest
    from orchestrator.backends.torch_inference import TorchInference
    from orchestrator.backends.torch_trainer import TorchTrainer, pad_batch
    from orchestrator.config import ActorConfig, InferenceConfig, ModelConfig, RolloutConfig
    from shm.codec import concat, decode, encode

    mc = ModelConfig(path=str(hf_model_dir))
    tc = _task(system_prompt="Be brief.")
    tokens = load_tokens(mc.path)
    r = PromptRenderer(tokens, tc)
    prompts = [r.ids([{"role": "user", "content": t}]) for t in ("copy 47", "reason step by step")]
    inf = TorchInference(mc, tc, RolloutConfig(), InferenceConfig(backend="torch"), seed=0)
    for k, p in enumerate(prompts):
        inf.add(GenRequest(k, k, p, 3, 12, 1.0))
    groups = {}
    while inf.num_active():
        for res in inf.step(0.0):
            groups[res.request_id] = res.sequences
    sampled = [groups[k] for k in sorted(groups)]
    batch = decode(bytes(encode(concat(sampled, kind=2, ident=1, version=0))))
    trainer = TorchTrainer(mc, ActorConfig(backend="torch"), tc, seed=0)
    padded = pad_batch(batch, trainer.pad_id)
    i = 0
    for g in sampled:
        for j in range(g.n):
            want = g.tokens[g.seq(j)]
            assert want[:len(prompts[g.ident])].tolist() == prompts[g.ident].tolist()
            assert np.asarray(batch.tokens[batch.seq(i)]).tobytes() == want.tobytes()
            assert padded["ids"][i, :len(want)].tolist() == want.tolist()
            i += 1
    lp = trainer.compute_logprobs(batch)
    mask = batch.loss_mask.astype(bool)
    assert mask.any()
    np.testing.assert_allclose(lp[mask], batch.logprobs[mask], atol=1e-4)


def _reference_char_tokenizer():
    """The built-in tokenizer as transformers built it until 2026-12-05 (PreTrainedTokenizerFast over
    the same WordLevel vocabulary, specials named as kwargs): the CharTokenizer must equal it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from orchestrator.data.tokens import BOS, EOS, PAD, VOCAB

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[a-z]+>|."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB.index(BOS))])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=PAD, clean_up_tokenization_spaces=False)


def test_the_builtin_tokenizer_equals_transformers_own_without_importing_it(tmp_path):
    import pickle
    import random
    from orchestrator.data.tokens import VOCAB, build_tokenizer

    ours, ref = build_tokenizer(), _reference_char_tokenizer()
    assert len(ours) == len(ref) == len(VOCAB) and ours.get_vocab() == ref.get_vocab()
    assert (ours.pad_token_id, ours.bos_token_id, ours.eos_token_id) == \
        (ref.pad_token_id, ref.bos_token_id, ref.eos_token_id)
    assert ours.chat_template is None and getattr(ref, "chat_template", None) is None
    rng = random.Random(0)
    pieces = [*"0123456789+-=>| ", "<eos>", "<bos>", "<pad>", "x", "\u00e9", "<eo"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12)))
        for specials in (True, False):
            ids = ours(text, add_special_tokens=specials)["input_ids"]
            assert ids == ref(text, add_special_tokens=specials)["input_ids"], (text, specials)
            assert ours(text, add_special_tokens=specials).input_ids == ids
        ids = [rng.randrange(len(VOCAB)) for _ in range(rng.randrange(0, 10))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    # the rest of transformers' API is transformers' own tokenizer, and survives pickling
    assert ours.convert_ids_to_tokens([1, 3]) == ref.convert_ids_to_tokens([1, 3])
    assert pickle.loads(pickle.dumps(ours))("47")["input_ids"] == ref("47")["input_ids"]
    ours.save_pretrained(tmp_path)
    from transformers import AutoTokenizer
    saved = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert saved("12>")["input_ids"] == ref("12>")["input_ids"] and saved.eos_token_id == ref.eos_token_id


def test_a_launch_builds_the_builtin_workload_without_transformers():
    """The supervisor's side of a launch (config, tokens, prompts, reward) imports no transformers
    and no torch for the built-in tokenizer: each would cost every launch seconds of CPU."""
    import subprocess
    import sys
    code = ("import sys; from orchestrator.config import load_config; "
            "from orchestrator.data.workload import build_task; "
            "t = build_task(load_config('configs/default.yaml', [])); t.train_prompt(0); "
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
