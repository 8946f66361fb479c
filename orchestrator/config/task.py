"""`task:` the workload: a built-in task or your data, reward, environment or agent."""
from __future__ import annotations

import os
from typing import Literal, Optional, Union

from pydantic import Field, model_validator

from orchestrator.config.base import MAX_TIMEOUT_S, MAX_TOKENS, MAX_COUNT, _Section


class DatasetSource(_Section):
    """One source of a mixture (`task.datasets`): its prompts, its share of the stream, its reward."""
    path: str = Field(min_length=1, description="training prompts, as task.dataset's formats")
    weight: float = Field(1.0, gt=0, le=1e6, description="its share of the training stream: "
                          "weight / the sum of the weights (> 0, finite)")
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="what the "
                                "step and eval lines call it (reward_mean/<name>) and the row's "
                                "`data_source` (verl's name) the reward sees. None: the file's stem")
    reward: Optional[str] = Field(None, min_length=1, description="its reward, as task.reward's "
                                  "forms. None: task.reward")
    eval_path: Optional[str] = Field(None, min_length=1, description="its eval prompts (eval "
                                     "lines report each source's reward). None: none of its own")

    @property
    def label(self) -> str:
        return self.name or os.path.splitext(os.path.basename(self.path.rstrip("/")))[0]


class TaskConfig(_Section):
    """What to train on: a built-in task generated in code, or a dataset with a reward function."""
    name: str = Field("sim", description="built-in task: copy2, copy3, reverse2, reverse3, first3, "
                      "add1 (digit tasks, orchestrator/data/digits.py) or sim (random prompts for the "
                      "sim backends); 'dataset' (implied by task.dataset) for your own data")
    dataset: Optional[str] = Field(None, description="training prompts: a .jsonl/.json file, a "
                                   ".parquet file, or a `datasets` save_to_disk directory (loaded "
                                   "with the `datasets` library, memory-mapped, offline)")
    eval_dataset: Optional[str] = Field(None, description="eval prompts, same formats (needed for "
                                        "eval.every_steps with task.dataset)")
    datasets: Optional[list[DatasetSource]] = Field(
        None, min_length=1, max_length=256, description="a weighted mixture instead of "
        "task.dataset: [{path, weight, name, reward, eval_path}, ...]; stream index i draws its "
        "source by weight from a generator keyed by (run.seed, i) and takes that source's next "
        "prompt (each source walks its own seeded epochs), so the stream is a pure function of "
        "seed and index (exact on resume); step and eval lines carry reward_mean/<name>")
    prompt_field: str = Field("prompt", min_length=1, description="the column holding the prompt: "
                              "a string, or a list of chat messages ({role, content})")
    answer_field: str = Field("answer", min_length=1, description="the column the built-in rewards "
                              "compare against (exact_match, math_answer, digits)")
    reward: Optional[str] = Field(None, min_length=1, description="built-in name (exact_match, "
                                  "math_answer, digits), 'path/to/file.py:fn' or 'package.module:fn'; "
                                  "fn(completion_text, row, completion_ids) -> float; None: the "
                                  "built-in task's own reward (required with task.dataset)")
    system_prompt: Optional[str] = Field(None, description="system turn put before every chat "
                                         "prompt that has none (needs chat rendering)")
    apply_chat_template: Union[bool, Literal["auto"]] = Field(
        "auto", description="plain-string prompts: true wraps each as one user turn rendered with the "
        "model's chat template, false tokenizes it as given; auto (the default): true when the "
        "tokenizer has a chat template, else false (said at start; config.yaml keeps the resolved "
        "value). Lists of messages are always rendered with the template")
    unknown_chars: Literal["error", "warn"] = Field(
        "error", description="prompts holding characters the tokenizer has no token for (they would "
        "become its unknown token, <pad> for the built-in one): error (exit 2 naming the row and "
        "the characters) or warn (one line at start with the count; trained as the unknown token)")
    max_prompt_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS, description="longest prompt "
                                             "in tokens; longer ones are handled per "
                                             "task.overlong_prompts. None: the dataset's longest")
    overlong_prompts: Literal["filter", "error"] = Field("filter", description="prompts longer than "
                                                         "task.max_prompt_tokens: filter (dropped at "
                                                         "load and counted) or error (exit 2)")
    reward_workers: int = Field(4, ge=0, le=256, description="reward threads per inference worker "
                                "(rewards run off the decode loop; <= 256). 0: each group scored "
                                "before decoding goes on, in finish order, for microsecond rewards "
                                "such as `digits` (a slow reward then stalls decoding; each call is "
                                "still bounded by task.reward_timeout_s)")
    reward_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="one reward call's "
                                    "time limit (<= 1 day)")
    reward_on_error: Literal["fail", "zero"] = Field("fail", description="a reward that raises, "
                                                     "times out or returns a non-finite value: fail "
                                                     "(exit 2 naming the function and the row) or "
                                                     "zero (score 0, counted as reward_errors in the "
                                                     "step line)")
    num_train_prompts: int = Field(100000, ge=1, le=1 << 62,
                                   description="size of the training prompt stream (prompt ids are "
                                   "int64, index mod this); it walks seeded permutations of the "
                                   "prompts, epoch by epoch, epochs following the index across the wrap")
    num_eval_prompts: Optional[int] = Field(None, ge=1, le=MAX_COUNT, description="eval prompts (a "
                                            "seeded choice; <= 1M: an eval round dispatches them all "
                                            "at once). None: 64 held out of a digit task, or every "
                                            "prompt of task.eval_dataset")

    env: Optional[str] = Field(None, min_length=1, description="multi-turn environment "
                               "(orchestrator/envs): a built-in name (lookup) or 'file.py:Class' / "
                               "'module:Class'; its rows are the dataset's, its score the reward. "
                               "None: single-turn (task.name=lookup implies env lookup)")
    env_args: dict[str, Union[bool, int, float, str]] = Field(
        default_factory=dict, description="keyword arguments of the environment's constructor "
        "(e.g. lookup: latency_s, latency_sigma)")
    max_turns: int = Field(8, ge=1, le=10000, description="model turns per episode; an episode "
                           "that needs more ends with reward 0 (counted as episodes_limited)")
    max_episode_tokens: Optional[int] = Field(None, ge=2, le=MAX_TOKENS, description="tokens per "
                                              "episode in all (opening, turns, replies); each turn "
                                              "gets at most rollout.max_new_tokens of what is left. "
                                              "None: the model's context (the rings are sized from it)")
    env_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="one environment call's "
                                 "time limit (reset, step, score); past it the episode ends with "
                                 "reward 0 (episodes_limited)")
    env_on_error: Literal["fail", "zero"] = Field("fail", description="an environment call that "
                                                  "raises or returns something unusable: fail (exit 2 "
                                                  "naming the environment and the row) or zero "
                                                  "(reward 0, counted as reward_errors)")
    env_workers: int = Field(4, ge=1, le=256, description="pool for blocking environment calls and "
                             "tools in each inference worker")
    env_processes: bool = Field(False, description="run tools (Environment.run_tool) in a process "
                                "pool of env_workers (CPU-heavy or untrusted tools; they must pickle)")
    env_max_stuck_calls: int = Field(4, ge=0, le=1024, description="blocking environment calls (plain "
                                     "methods, thread tools) still running past task.env_timeout_s "
                                     "that an inference worker tolerates: each one's episode ended "
                                     "(episodes_limited) and its pool thread was replaced; one more "
                                     "is a hang (task.env_on_hang)")
    agent: Optional[str] = Field(None, min_length=1, description="an agent over HTTP instead of an "
                                 "environment (exclusive with task.env): 'file.py:run' or 'module:run', "
                                 "run(row, base_url, api_key) -> float | None (async or plain), called once "
                                 "per episode with the dataset row and an OpenAI-compatible endpoint of "
                                 "the inference worker (envs/agent.py); None returned: task.reward "
                                 "scores the transcript. Its calls obey task.max_turns, "
                                 "task.max_episode_tokens and task.env_timeout_s (each call)")
    agent_timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S, description="one agent run's time "
                                   "limit (the whole episode); past it the episode ends with reward 0 "
                                   "(episodes_limited)")
    env_hang_limit: int = Field(2, ge=0, le=10_000, description="hangs of one dataset row's "
                                "environment (a blocking call abandoned past task.env_timeout_s, or "
                                "a call that blocked the environment loop) after which the row is "
                                "quarantined: its prompts skipped for the rest of the run, across "
                                "resume (logged with its prompt index; the step line's "
                                "rows_quarantined and quarantined_prompts). 0: never")
    env_on_hang: Literal["restart", "fail"] = Field("restart", description="an environment that hangs "
                                                    "its inference worker (more than "
                                                    "task.env_max_stuck_calls stuck calls, or an async "
                                                    "method blocking the environment loop for longer "
                                                    "than task.env_timeout_s): restart (the worker "
                                                    "exits with code 75 and is restarted with its "
                                                    "prompts re-dispatched, per "
                                                    "inference.on_worker_death) or fail (the run fails "
                                                    "naming the environment, exit 1)")

    @property
    def data_key(self) -> Optional[str]:
        """The key the prompts come from: 'task.dataset', 'task.datasets', or None (built in)."""
        return "task.dataset" if self.dataset is not None else \
            "task.datasets" if self.datasets is not None else None

    @property
    def own_data(self) -> bool:
        """Prompts from files (task.dataset or task.datasets), not a built-in task."""
        return self.data_key is not None

    @property
    def has_eval_data(self) -> bool:
        """Eval prompts of your own: task.eval_dataset, or an eval_path on a mixture's source."""
        return self.eval_dataset is not None or any(d.eval_path is not None
                                                    for d in self.datasets or ())

    @model_validator(mode="after")
    def _dataset_or_builtin(self) -> "TaskConfig":
        if self.datasets is not None:
            self._check_mixture()
        if self.own_data:
            if "name" not in self.model_fields_set:
                object.__setattr__(self, "name", "dataset")
            elif self.name != "dataset":
                raise ValueError(f"task.name={self.name!r} and {self.data_key} are exclusive (task.name "
                                 f"is 'dataset' for your own data)")
        elif self.name == "dataset":
            raise ValueError("task.name='dataset' needs task.dataset or task.datasets")
        if self.agent is not None and self.env is not None:
            raise ValueError(f"task.agent and task.env are exclusive: the agent {self.agent!r} is the "
                             f"episode (drop task.env={self.env!r})")
        if self.name == "lookup" and self.env not in (None, "lookup"):
            raise ValueError(f"task.name='lookup' is the lookup environment's task; task.env="
                             f"{self.env!r} needs its own dataset (task.dataset)")
        if self.reward is not None and (self.env is not None or (self.name == "lookup"
                                                                  and self.agent is None)):
            raise ValueError("task.reward and task.env are exclusive: an environment scores its own "
                             "episodes")
        if self.dataset is not None and self.reward is None and self.env is None and self.agent is None:
            raise ValueError("task.dataset needs task.reward (a built-in name, 'file.py:fn' or "
                             "'module:fn'), task.env or task.agent")
        return self

    def _check_mixture(self) -> None:
        if self.dataset is not None or self.eval_dataset is not None:
            raise ValueError("task.datasets and task.dataset / task.eval_dataset are exclusive (a "
                             "mixture's sources carry their own path and eval_path)")
        labels = [d.label for d in self.datasets]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"task.datasets: two sources are called {twice[0]!r}: give each a "
                             f"name of its own (task.datasets[i].name)")
        scored_elsewhere = self.env is not None or self.agent is not None
        for i, d in enumerate(self.datasets):
            if d.reward is not None and scored_elsewhere:
                raise ValueError(f"task.datasets[{i}].reward with task.env / task.agent: the "
                                 f"environment or agent scores its episodes")
            if d.reward is None and self.reward is None and not scored_elsewhere:
                raise ValueError(f"task.datasets[{i}] ({d.label}) has no reward: set "
                                 f"task.datasets[{i}].reward or task.reward")
        total = sum(d.weight for d in self.datasets)
        if not total < float("inf"):
            raise ValueError("task.datasets: the weights' sum is not finite")
