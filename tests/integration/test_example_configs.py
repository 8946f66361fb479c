"""The example configs under configs/examples validate as written, and with their paths pointed at
this test's fixtures (the HF model directory, a GSM8K-shaped Parquet file) their workload loads on
the generic path: the chat template renders, the reward scores reference answers as right."""
from pathlib import Path

import pytest

from orchestrator.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "configs" / "examples").glob("*.yaml"))
datasets = pytest.importorskip("datasets")


def test_there_are_examples():
    assert any(p.name.startswith("gsm8k") for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_loads_on_the_fixtures(path, hf_model_dir, tmp_path):
    from orchestrator.data.workload import load_prompts
    from tests.workload import prompts_and_reward

    rows = [{"question": f"Tom has {a} apples and buys {b}. How many now?",
             "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b:,}"}
            for a in range(3, 30, 3) for b in (7, 1200)]
    for name in ("train", "test"):
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / f"{name}.parquet"))
    cfg = load_config(path, [f"model.path={hf_model_dir}", f"run.dir={tmp_path / 'run'}",
                             f"task.dataset={tmp_path / 'train.parquet'}",
                             f"task.eval_dataset={tmp_path / 'test.parquet'}"])
    prompts, reward = prompts_and_reward(cfg)
    assert prompts.filtered == 0 and prompts.num_eval == len(rows)
    pid, ids, row = prompts.train_prompt(0)
    text = prompts.renderer.tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and rows[row]["question"] in text
    assert text.endswith("<|im_start|>assistant\n")
    total = rows[row]["answer"].rsplit("#### ", 1)[1]
    tok = prompts.renderer.tok
    right = tok(f"so the answer is #### {total}", add_special_tokens=False)["input_ids"]
    wrong = tok("so the answer is #### 0", add_special_tokens=False)["input_ids"]
    assert reward(row, right) == 1.0 and reward(row, wrong) == 0.0
    assert isinstance(load_prompts(cfg).max_prompt_tokens, int)
