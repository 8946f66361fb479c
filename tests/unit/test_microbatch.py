"""How a batch is split across trainer ranks and into micro-batches (orchestrator.backends.microbatch)."""
import random

import pytest

from orchestrator.backends.microbatch import micro_batches, plan, split_ranks


def test_ranks_balanced_by_tokens():
    lengths = [100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
    a, b = split_ranks(lengths, 2)
    assert a == [0] and sorted(b) == list(range(1, 11))      # 100 tokens each, not 6 vs 5 sequences


def test_greedy_balance_within_longest():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 500) for _ in range(rng.randint(1, 64))]
        for world in (2, 3, 4, 8):
            loads = [sum(lengths[i] for i in r) for r in split_ranks(lengths, world)]
            assert max(loads) - min(loads) <= max(lengths)


@pytest.mark.parametrize("budget", [None, 1, 16, 50, 10_000])
def test_micro_batches_respect_budget_and_cover_once(budget):
    rng = random.Random(budget or 0)
    lengths = [rng.randint(1, 40) for _ in range(30)]
    mbs = micro_batches(range(30), lengths, budget)
    assert sorted(i for m in mbs for i in m) == list(range(30))
    for m in mbs:
        padded = len(m) * max(lengths[i] for i in m)
        assert budget is None or padded <= budget or len(m) == 1
    if budget is None:
        assert len(mbs) == 1


def test_every_rank_gets_the_same_number_of_passes():
    lengths = [30, 5, 5, 5]
    p = plan(lengths, 2, 10)          # rank 0: [30]; rank 1: [5, 5] and [5]
    assert [len(r) for r in p] == [2, 2]
    assert sorted(i for r in p for m in r for i in m) == [0, 1, 2, 3]
    assert p[0] == [[0], []]          # the rank with less work runs an empty (zero-weight) pass


def test_plan_is_a_function_of_lengths():
    lengths = [7, 3, 9, 9, 1, 4]
    assert plan(lengths, 2, 12) == plan(list(lengths), 2, 12)


def test_empty_batch_one_empty_pass_per_rank():
    assert plan([], 2, None) == [[[]], [[]]]


def test_packed_budget_counts_real_tokens():
    lengths = [30, 10, 10, 10]
    assert micro_batches(range(4), lengths, 40) == [[0], [1, 2, 3]]              # padded: 3 x 10
    assert micro_batches(range(4), lengths, 40, packed=True) == [[0, 1], [2, 3]]  # 30 + 10; 10 + 10
    rng = random.Random(5)
    lengths = [rng.randint(1, 40) for _ in range(50)]
    for m in micro_batches(range(50), lengths, 64, packed=True):
        assert sum(lengths[i] for i in m) <= 64 or len(m) == 1
