"""Tasks (orchestrator.task) and the offline tokenizer: prompts, held-out eval, verifiable rewards."""
import numpy as np
import pytest

from orchestrator.config import TaskConfig
from orchestrator.model import VOCAB, build_tokenizer
from orchestrator.task import TASKS, make_task, task_names

TOK = build_tokenizer("copy2")


def _ids(text):
    return np.asarray(TOK.convert_tokens_to_ids(list(text)), dtype=np.int32)


def test_tokenizer_is_offline_char_level_with_special_tokens():
    assert len(TOK) == len(VOCAB)
    assert (TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id) == (0, 1, 2)
    ids = TOK("<bos>12+3=").input_ids
    assert ids == [1, *_ids("12+3=").tolist()]
    assert TOK.convert_ids_to_tokens(ids) == ["<bos>", "1", "2", "+", "3", "="]


def test_unknown_task_name_names_the_field():
    with pytest.raises(ValueError, match=r"task\.name"):
        make_task(TaskConfig(name="nope"), TOK, 0)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_eval_set_is_held_out_from_training_prompts(name):
    task = make_task(TaskConfig(name=name, num_train_prompts=2000, num_eval_prompts=64), TOK, 0)
    evals = {tuple(p) for _, p in task.eval_prompts()}
    train = {tuple(task.train_prompt(i)[1]) for i in range(task.num_train)}
    assert evals and train and not evals & train
    assert len(task.eval_prompts()) == task.num_eval <= 64
    for _, p in task.eval_prompts()[:3]:
        assert p.dtype == np.int32 and p[0] == TOK.bos_token_id


def test_train_stream_is_deterministic_in_seed_and_index():
    cfg = TaskConfig(name="copy3", num_train_prompts=5000)
    a, b, c = make_task(cfg, TOK, 1), make_task(cfg, TOK, 1), make_task(cfg, TOK, 2)
    for i in (0, 17, 999, 4999):
        pid, p = a.train_prompt(i)
        assert pid == i and np.array_equal(p, b.train_prompt(i)[1])
    assert any(not np.array_equal(a.train_prompt(i)[1], c.train_prompt(i)[1]) for i in range(10))
    pid, p = a.train_prompt(5000 + 17)                       # the stream wraps
    assert pid == 17 and np.array_equal(p, a.train_prompt(17)[1])
    with pytest.raises(IndexError):
        a.reward(5000, p, False)


def test_eval_size_is_capped_to_a_quarter_of_the_universe():
    task = make_task(TaskConfig(name="add1", num_eval_prompts=64), TOK, 0)
    assert task.num_eval == 25


@pytest.mark.parametrize("name,prompt,answer", [
    ("copy2", "47>", "47"), ("copy3", "472>", "472"), ("reverse2", "47>", "74"),
    ("reverse3", "472>", "274"), ("first3", "472>", "4"), ("add1", "7+5=", "12"),
])
def test_reward_is_exact_match_with_partial_credit(name, prompt, answer):
    task = make_task(TaskConfig(name=name, num_train_prompts=3000), TOK, 0)
    want = np.concatenate([[TOK.bos_token_id], _ids(prompt)])
    for is_eval, prompts in ((True, task.eval_prompts()),
                             (False, [task.train_prompt(i) for i in range(3000)])):
        hits = [pid for pid, p in prompts if np.array_equal(p, want)]
        if not hits:
            continue
        pid = hits[0]
        eos = TOK.eos_token_id
        full = np.concatenate([_ids(answer), [eos]])
        assert task.reward(pid, full, is_eval) == 1.0
        assert task.reward(pid, np.concatenate([full, _ids("99")]), is_eval) == 1.0  # after eos
        assert task.reward(pid, _ids(answer), is_eval) == pytest.approx(len(answer) / (len(answer) + 1))
        assert task.reward(pid, np.array([eos], np.int32), is_eval) == 0.0
        assert task.reward(pid, np.zeros(0, np.int32), is_eval) == 0.0
        wrong = np.concatenate([_ids("+" * len(answer)), [eos]])
        assert task.reward(pid, wrong, is_eval) == pytest.approx(1 / (len(answer) + 1))
        break
    else:
        pytest.fail(f"prompt {prompt} found in neither split")


def test_random_completions_score_low():
    task = make_task(TaskConfig(name="copy2"), TOK, 0)
    rng = np.random.default_rng(0)
    rewards = [task.reward(i, rng.integers(0, len(VOCAB), 4).astype(np.int32), False)
               for i in range(500)]
    assert np.mean(rewards) < 0.15


def test_sim_task_gives_random_prompts_and_zero_reward():
    task = make_task(TaskConfig(name="sim", num_train_prompts=10, num_eval_prompts=3), None, 0,
                     prompt_tokens=5)
    pid, p = task.train_prompt(4)
    assert pid == 4 and p.shape == (5,) and p.dtype == np.int32
    assert np.array_equal(p, task.train_prompt(4)[1])
    assert len(task.eval_prompts()) == 3 and task.num_train == 10
    assert task.reward(0, p, False) == 0.0
    assert "sim" in task_names()
