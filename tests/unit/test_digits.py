"""Built-in digit tasks as datasets on the generic path (orchestrator.data.digits + prompt_set):
prompts, held-out eval, the deterministic stream, the positional `digits` reward; the offline
character tokenizer."""
import numpy as np
import pytest

from orchestrator.data.digits import TASKS, digit_datasets, task_names
from orchestrator.data.tokens import VOCAB, build_tokenizer
from tests.workload import prompts_and_reward, workload_config

TOK = build_tokenizer()


def _ids(text):
    return np.asarray(TOK.convert_tokens_to_ids(list(text)), dtype=np.int32)


def test_tokenizer_is_offline_char_level_with_bos_first():
    assert len(TOK) == len(VOCAB)
    assert (TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id) == (0, 1, 2)
    assert TOK("12+3=").input_ids == [1, *_ids("12+3=").tolist()]
    assert TOK.convert_ids_to_tokens(TOK("1>").input_ids) == ["<bos>", "1", ">"]
    assert TOK.decode(_ids("47").tolist() + [2], skip_special_tokens=True) == "47"


def test_unknown_task_name_names_the_field():
    with pytest.raises(ValueError, match=r"task\.name"):
        digit_datasets("nope", None, 0)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_eval_set_is_held_out_from_training_prompts(name):
    prompts, _ = prompts_and_reward(workload_config(name=name, num_train_prompts=2000))
    evals = {tuple(p) for _, p, _ in prompts.eval_prompts()}
    train = {tuple(prompts.train_prompt(i)[1]) for i in range(prompts.num_train)}
    assert evals and train and not evals & train
    assert len(prompts.eval_prompts()) == prompts.num_eval <= 64
    for _, p, _ in prompts.eval_prompts()[:3]:
        assert p.dtype == np.int32 and p[0] == TOK.bos_token_id


def test_train_stream_is_deterministic_in_seed_and_index():
    def build(seed):
        cfg = workload_config(name="copy3", num_train_prompts=5000)
        cfg.run.seed = seed
        return prompts_and_reward(cfg)[0]
    a, b, c = build(1), build(1), build(2)
    for i in (0, 17, 999, 4999):
        pid, p, row = a.train_prompt(i)
        assert pid == i and np.array_equal(p, b.train_prompt(i)[1]) and row == b.train_prompt(i)[2]
    assert any(not np.array_equal(a.train_prompt(i)[1], c.train_prompt(i)[1]) for i in range(10))
    pid, p, row = a.train_prompt(5000 + 17)     # prompt ids wrap; epochs follow the index (#22)
    assert pid == 17 and row == a.row_at(5000 + 17) and np.array_equal(p, b.train_prompt(5017)[1])
    with pytest.raises(IndexError):
        a.train_row(5000)


def test_eval_size_is_capped_to_a_quarter_of_the_universe():
    prompts, _ = prompts_and_reward(workload_config(name="add1", num_eval_prompts=64))
    assert prompts.num_eval == 25


@pytest.mark.parametrize("name,prompt,answer", [
    ("copy2", "47>", "47"), ("copy3", "472>", "472"), ("reverse2", "47>", "74"),
    ("reverse3", "472>", "274"), ("first3", "472>", "4"), ("add1", "7+5=", "12"),
])
def test_reward_is_positional_with_partial_credit(name, prompt, answer):
    prompts, reward = prompts_and_reward(workload_config(name=name, num_train_prompts=3000))
    want = np.concatenate([[TOK.bos_token_id], _ids(prompt)])
    for is_eval, listed in ((True, prompts.eval_prompts()),
                            (False, [prompts.train_prompt(i) for i in range(3000)])):
        hits = [row for _, p, row in listed if np.array_equal(p, want)]
        if not hits:
            continue
        row, eos = hits[0], TOK.eos_token_id
        full = np.concatenate([_ids(answer), [eos]])
        assert reward(row, full, is_eval) == 1.0
        assert reward(row, np.concatenate([full, _ids("99")]), is_eval) == 1.0  # after eos
        assert reward(row, _ids(answer), is_eval) == pytest.approx(len(answer) / (len(answer) + 1))
        assert reward(row, np.array([eos], np.int32), is_eval) == 0.0
        assert reward(row, np.zeros(0, np.int32), is_eval) == 0.0
        wrong = np.concatenate([_ids("+" * len(answer)), [eos]])
        assert reward(row, wrong, is_eval) == pytest.approx(1 / (len(answer) + 1))
        break
    else:
        pytest.fail(f"prompt {prompt} found in neither split")


def test_random_completions_score_low():
    prompts, reward = prompts_and_reward(workload_config(name="copy2"))
    rng = np.random.default_rng(0)
    rewards = [reward(prompts.train_prompt(i)[2], rng.integers(0, len(VOCAB), 4), False)
               for i in range(500)]
    assert np.mean(rewards) < 0.15


def test_sim_task_gives_random_prompts_without_rows():
    from orchestrator.config import Config
    from orchestrator.data.workload import NO_ROW, build_task
    cfg = Config.model_validate({"task": {"name": "sim", "num_train_prompts": 10,
                                          "num_eval_prompts": 3},
                                 "inference": {"sim": {"prompt_tokens": 5}}})
    task = build_task(cfg)
    pid, p, row = task.train_prompt(4)
    assert pid == 4 and p.shape == (5,) and p.dtype == np.int32 and row == NO_ROW
    assert np.array_equal(p, task.train_prompt(4)[1])
    assert len(task.eval_prompts()) == 3 and task.num_train == 10 and task.max_prompt_tokens == 5
    assert {"sim", "dataset"} <= set(task_names())


def test_built_in_rows_read_as_the_same_dataset_would():
    """`Rows` against `datasets.Dataset.from_dict` of the same columns through the generic path:
    the same kept rows, ids and identity (a run made before `Rows` resumes under it)."""
    datasets = pytest.importorskip("datasets")
    from orchestrator.data.digits import Rows
    from orchestrator.data.prompt_set import PromptSet
    from orchestrator.data.tokens import PromptRenderer, load_tokens

    cfg = workload_config(name="add1")
    train, evl = digit_datasets("add1", None, 0)
    assert isinstance(train, Rows) and len(train) + len(evl) == 100
    as_ds = [datasets.Dataset.from_dict({c: [r[c] for r in (t[i] for i in range(len(t)))]
                                         for c in t.column_names}) for t in (train, evl)]
    renderer = PromptRenderer(load_tokens(None), cfg.task)
    a = PromptSet(train, evl, renderer, cfg.task, 0, needs_answer=True)
    b = PromptSet(*as_ds, renderer, cfg.task, 0, needs_answer=True)
    assert a.identity == b.identity and a.max_prompt_tokens == b.max_prompt_tokens
    for i in range(0, 300, 7):
        assert np.array_equal(a.train_prompt(i)[1], b.train_prompt(i)[1])
    assert [p.tolist() for _, p, _ in a.eval_prompts()] == [p.tolist() for _, p, _ in b.eval_prompts()]
    assert train[-1] == as_ds[0][len(train) - 1] and train[3] == as_ds[0][3]
    with pytest.raises(IndexError):
        train[len(train)]


def test_a_built_in_task_loads_without_importing_datasets():
    from tests.fresh import fresh_python
    code = ("import sys; from tests.workload import workload_config, prompts_and_reward; "
            "p, r = prompts_and_reward(workload_config(name='copy2')); "
            "assert p.num_train > 0 and r(p.train_prompt(0)[2], [1]) == 0.0; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('datasets', 'pandas', 'pyarrow')))")
    out = fresh_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
