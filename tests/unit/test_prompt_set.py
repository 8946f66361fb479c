"""Datasets on the generic path (orchestrator.data.prompt_set): JSONL, Parquet and save_to_disk
directories load through `datasets` (memory-mapped Arrow); overlong prompts are filtered and
counted; the eval set is every row or a seeded choice; the stream visits every kept row once per
epoch."""
import json

import pytest

from orchestrator.data.tokens import DataError
from tests.workload import prompts_and_reward, workload_config

datasets = pytest.importorskip("datasets")

ROWS = [{"prompt": f"{i}>" if i % 5 else "1" * 20 + ">", "answer": str(i)} for i in range(30)]


def _write(tmp_path, kind):
    if kind == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    elif kind == "disk":
        path = tmp_path / "d"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    else:                                   # a DatasetDict with one split
        path = tmp_path / "dd"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "disk", "dict"])
def test_formats_filter_overlong_prompts_and_count_them(tmp_path, kind):
    path = _write(tmp_path, kind)
    cfg = workload_config(dataset=path, eval_dataset=path, reward="exact_match",
                          max_prompt_tokens=8, num_train_prompts=50, num_eval_prompts=4)
    prompts, reward = prompts_and_reward(cfg)
    for ds in (prompts.train, prompts.eval):    # Arrow files mapped, not read into the heap
        assert type(ds.data).__name__ == "MemoryMappedTable" and ds.cache_files
    assert prompts.filtered == 2 * 6            # rows 0, 5, ..., 25 in train and in eval
    assert prompts.max_prompt_tokens == 4        # bos + "29>"
    rows = [prompts.train_prompt(i)[2] for i in range(24)]
    assert sorted(rows) == [i for i in range(30) if i % 5]       # one epoch: every kept row once
    evals = prompts.eval_prompts()
    assert len(evals) == 4 and all(r % 5 for _, _, r in evals)
    pid, ids, row = prompts.train_prompt(3)
    assert ids.tolist() == prompts.renderer.ids(ROWS[row]["prompt"]).tolist()
    assert reward(row, prompts.renderer.tok(ROWS[row]["answer"], add_special_tokens=False)["input_ids"]
                  + [2]) == 1.0


def test_a_datasetdict_of_several_splits_must_be_pointed_at_one(tmp_path):
    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(path))
    with pytest.raises(DataError, match=r"splits \['test', 'train'\]"):
        prompts_and_reward(workload_config(dataset=str(path), reward="exact_match"))


def test_every_prompt_overlong_is_an_error(tmp_path):
    path = _write(tmp_path, "jsonl")
    with pytest.raises(DataError, match="every one of its 30 prompts"):
        prompts_and_reward(workload_config(dataset=path, reward="exact_match", max_prompt_tokens=1))


def test_the_stream_is_seeded(tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = workload_config(dataset=path, reward="exact_match")
    pa = prompts_and_reward(cfg)[0]
    a = [pa.train_prompt(i)[2] for i in range(30)]
    cfg.run.seed = 1
    pb = prompts_and_reward(cfg)[0]
    b = [pb.train_prompt(i)[2] for i in range(30)]
    assert sorted(a) == sorted(b) == list(range(30)) and a != b


def _numbered(tmp_path, n):
    path = tmp_path / f"rows{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}>", "answer": str(i)}) + "\n" for i in range(n)))
    return str(path)


@pytest.mark.parametrize("rows, num_train", [(7, 10), (7, 3), (6, 4), (5, 1), (7, 14), (1, 4)])
def test_every_epoch_is_a_full_permutation_across_the_wrap(tmp_path, rows, num_train):
    """7 rows, 10 prompt ids: the stream used to restart epoch 0 at every wrap of the prompt ids, so
    3 rows came twice as often as 4. Epochs follow the stream index: each is a full seeded
    permutation, however the prompt ids wrap."""
    cfg = workload_config(dataset=_numbered(tmp_path, rows), reward="exact_match",
                          num_train_prompts=num_train)
    prompts = prompts_and_reward(cfg)[0]
    epochs = 6
    stream = [prompts.train_prompt(i) for i in range(rows * epochs)]
    assert [pid for pid, _, _ in stream] == [i % num_train for i in range(rows * epochs)]
    orders = [[row for _, _, row in stream[e * rows:(e + 1) * rows]] for e in range(epochs)]
    assert all(sorted(order) == list(range(rows)) for order in orders)
    if rows > 2:
        assert len({tuple(order) for order in orders}) > 1        # each epoch its own permutation
    for pid, ids, row in stream:
        assert ids.tolist() == prompts.renderer.ids(f"{row}>").tolist()
    for pid in range(min(num_train, rows * epochs)):   # the first pass: a prompt id's row as before
        assert prompts.train_row(pid) == stream[pid][2]


def test_a_resume_at_any_cursor_continues_the_same_stream(tmp_path):
    """A resumed run builds a fresh prompt set and a cursor from the checkpoint (next index, redo
    list): it deals exactly the (prompt id, tokens, row) the uninterrupted run would have."""
    from orchestrator.loop.prompts import PromptCursor

    cfg = workload_config(dataset=_numbered(tmp_path, 7), reward="exact_match", num_train_prompts=10)
    whole = PromptCursor(prompts_and_reward(cfg)[0])
    dealt = [whole.next() for _ in range(80)]
    resumed = prompts_and_reward(cfg)[0]           # cold permutation cache, as after a restart
    for cursor in (63, 0, 9, 10, 13, 14, 41, 70, 7, 20):
        redo = [i for i in (cursor - 9, cursor - 3, cursor - 1) if i >= 0]
        c = PromptCursor(resumed, cursor, redo)
        got = [c.next() for _ in range(len(redo) + 10)]
        want = [dealt[i] for i in redo + list(range(cursor, cursor + 10))]
        assert [(i, pid, row) for i, pid, _, row in got] == [(i, pid, row) for i, pid, _, row in want]
        assert all(a[2].tolist() == b[2].tolist() for a, b in zip(got, want))
