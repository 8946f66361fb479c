"""Prompt sets: a training and an eval dataset, rendered to token ids, streamed deterministically.

Contract:
- `open_dataset(path, what) -> datasets.Dataset`: a .jsonl/.json, .parquet or .csv file (through
  `datasets.load_dataset`, converted once to memory-mapped Arrow files in the `datasets` cache,
  HF_DATASETS_CACHE) or a `save_to_disk` directory (`load_from_disk`, memory-mapped; a DatasetDict
  must hold one split). Offline only. A missing, unreadable or empty dataset raises `DataError`
  naming `what` (the config field) and the path.
- `PromptSet(train, eval, renderer, task_cfg, seed, eval_limit)`: checks the prompt column (and the
  answer column, when the reward reads it) exists, renders every prompt once at load to measure it
  (only the kept row indices stay in memory), and handles prompts longer than
  `task.max_prompt_tokens` per `task.overlong_prompts` (dropped and counted in `filtered`, or a
  `DataError` naming the row). `max_prompt_tokens` is the longest kept prompt. `identity` (kept
  training prompts and a digest of their rows and token ids) goes into every checkpoint: a resume
  whose prompts differ would break exactly-once, and is refused (run_dir.check_data).
- The stream: `train_prompt(index) -> (prompt_id, ids, row)`, deterministic in (seed, index):
  `prompt_id = index % task.num_train_prompts`; `row` (the dataset row index, what the reward looks
  up) is `row_at(index)`: epoch `index // kept rows` is its own seeded permutation of the kept
  rows, so every epoch holds each row exactly once, also across the wrap of the prompt ids (a
  `num_train_prompts` that is not a multiple of the kept rows ends the ids part-way through an
  epoch; the next index carries on with that epoch). On the first pass (index < num_train_prompts)
  this is the layout of earlier versions, and `train_row(prompt_id)` is that pass's row; past it,
  a prompt id's row changes from pass to pass (the index, not the id, names the row). `eval_prompts()`
  lists (eval position, ids, row) for every kept eval row, or a seeded choice of `eval_limit` of
  them. Nothing here is on the decode path: prompts are rendered when admitted.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

from orchestrator.data.tokens import DataError, PromptRenderer

BATCH_ROWS = 1024
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _quiet_datasets():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)     # its errors become ours
    return datasets


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def open_dataset(path: str, what: str):
    if not os.path.exists(path):      # what needs no `datasets` is checked before importing it
        raise DataError(f"{what}={path}: no such file or directory")
    builder = None if os.path.isdir(path) else _BUILDERS.get(os.path.splitext(path)[1].lower())
    if not os.path.isdir(path) and builder is None:
        raise DataError(f"{what}={path}: unknown format (expected .jsonl, .json, .parquet, .csv "
                        f"or a `datasets` save_to_disk directory)")
    if not os.access(path, os.R_OK):
        raise DataError(f"{what}={path}: not readable")
    datasets = _quiet_datasets()
    if os.path.isdir(path):
        try:
            ds = datasets.load_from_disk(path)
        except Exception as exc:
            raise DataError(f"{what}={path}: not a `datasets` save_to_disk directory "
                            f"({_why(exc)})") from None
        if isinstance(ds, datasets.DatasetDict):
            if len(ds) != 1:
                raise DataError(f"{what}={path} holds splits {sorted(ds)}: point it at one of them "
                                f"(e.g. {os.path.join(path, sorted(ds)[0])})")
            ds = next(iter(ds.values()))
    else:
        try:
            ds = datasets.load_dataset(builder, data_files=os.path.abspath(path), split="train",
                                       cache_dir=os.environ.get("HF_DATASETS_CACHE"))
        except Exception as exc:
            raise DataError(f"{what}={path}: cannot read it as {builder} ({_why(exc)})") from None
    if len(ds) == 0:
        raise DataError(f"{what}={path} is empty")
    return ds


class PromptSet:
    def __init__(self, train, eval, renderer: PromptRenderer, task_cfg, seed: int,
                 eval_limit: Optional[int] = None, needs_answer: bool = False,
                 names: tuple[str, str] = ("task.dataset", "task.eval_dataset")):
        self.renderer = renderer
        self.field = task_cfg.prompt_field
        self.limit = task_cfg.max_prompt_tokens
        self.overlong = task_cfg.overlong_prompts
        self._num_train = int(task_cfg.num_train_prompts)
        self._seed = int(seed)
        self.train, self.eval = train, eval
        self.filtered = 0
        self.max_prompt_tokens = 0
        self._digest = hashlib.blake2b(digest_size=16)
        self._pool = self._measure(train, names[0], task_cfg, needs_answer, self._digest)
        self.identity = {"prompts": int(len(self._pool)), "digest": self._digest.hexdigest()}
        self._eval_rows = np.zeros(0, np.int64)
        if eval is not None:
            rows = self._measure(eval, names[1], task_cfg, needs_answer)
            if eval_limit is not None and eval_limit < len(rows):
                pick = np.random.default_rng([self._seed, 0xE7A1]).choice(len(rows), eval_limit,
                                                                          replace=False)
                rows = rows[np.sort(pick)]
            self._eval_rows = rows
        self._perm_cache: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ load
    def _measure(self, ds, what: str, task_cfg, needs_answer: bool, digest=None) -> np.ndarray:
        for col, field in ((self.field, "task.prompt_field"),
                           *(((task_cfg.answer_field, "task.answer_field"),) if needs_answer else ())):
            if col not in ds.column_names:
                raise DataError(f"{what}: no column '{col}' ({field}); it has "
                                f"{', '.join(ds.column_names)}")
        keep, row = [], 0
        for batch in ds.select_columns([self.field]).iter(batch_size=BATCH_ROWS):
            for value in batch[self.field]:
                try:
                    ids = self.renderer.ids(value)
                except DataError as exc:
                    raise DataError(f"{what} row {row}: {exc}") from None
                n = len(ids)
                if n == 0:
                    raise DataError(f"{what} row {row}: the prompt renders to no tokens")
                if self.limit is not None and n > self.limit:
                    if self.overlong == "error":
                        raise DataError(f"{what} row {row}: prompt of {n} tokens is longer than "
                                        f"task.max_prompt_tokens={self.limit} "
                                        f"(task.overlong_prompts=error)")
                    self.filtered += 1
                else:
                    keep.append(row)
                    self.max_prompt_tokens = max(self.max_prompt_tokens, n)
                    if digest is not None:
                        digest.update(np.array([row, n], np.int64).tobytes() + ids.tobytes())
                row += 1
        if not keep:
            raise DataError(f"{what}: every one of its {row} prompts is longer than "
                            f"task.max_prompt_tokens={self.limit}")
        return np.asarray(keep, dtype=np.int64)

    # ------------------------------------------------------------------ streams
    @property
    def num_train(self) -> int:
        return self._num_train

    @property
    def num_eval(self) -> int:
        return len(self._eval_rows)

    def row_at(self, index: int) -> int:
        """Dataset row at stream index `index` (a pure function of seed and index)."""
        epoch, pos = divmod(index, len(self._pool))
        perm = self._perm_cache.get(epoch)
        if perm is None:
            if len(self._perm_cache) > 4:
                self._perm_cache.clear()
            perm = np.random.default_rng([self._seed, 0x51, epoch]).permutation(len(self._pool))
            self._perm_cache[epoch] = perm
        return int(self._pool[perm[pos]])

    def train_row(self, prompt_id: int) -> int:
        """Dataset row of training prompt id `prompt_id` on the stream's first pass (index == id)."""
        if not 0 <= prompt_id < self._num_train:
            raise IndexError(f"train prompt id {prompt_id} outside [0, {self._num_train})")
        return self.row_at(prompt_id)

    def _ids(self, ds, row: int) -> np.ndarray:
        return self.renderer.ids(ds[row][self.field])

    def train_prompt(self, index: int) -> tuple[int, np.ndarray, int]:
        row = self.row_at(index)
        return index % self._num_train, self._ids(self.train, row), row

    def eval_prompts(self) -> list[tuple[int, np.ndarray, int]]:
        return [(i, self._ids(self.eval, int(r)), int(r)) for i, r in enumerate(self._eval_rows)]
