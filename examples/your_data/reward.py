"""The reward of the docs' "your data" example: the fraction of answer positions right.

`task.reward: examples/your_data/reward.py:score` calls `score(completion_text, row,
completion_ids)` once per sample, `row` being the dataset row (here `prompt` and `answer`).
"""


def score(completion_text: str, row: dict, completion_ids: list[int]) -> float:
    answer = row["answer"]
    return sum(a == b for a, b in zip(completion_text, answer)) / len(answer)
