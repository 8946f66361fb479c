"""orchestrator.algo.compute_advantages: every estimator against hand-computed values, singleton,
all-equal and empty groups, samples without tokens, and the numpy-only import."""
import math
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.algo import ESTIMATORS, compute_advantages

EPS = 1e-6
# one group of three (rewards 1, 0, 2: mean 1) and one of two (3, 5: mean 4)
R = [1.0, 0.0, 2.0, 3.0, 5.0]
G = [7, 7, 7, 2, 2]


def test_grpo_divides_by_the_unbiased_group_std():
    # group 7: deviations 0, -1, 1; unbiased var = 2 / 2 = 1. group 2: -1, 1; var = 2 / 1 = 2
    want = [0.0, -1 / (1 + EPS), 1 / (1 + EPS), -1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)]
    assert compute_advantages(R, G, "grpo") == pytest.approx(want, abs=1e-12)


def test_grpo_population_std_is_the_original_advantage():
    # population var: group 7 = 2 / 3, group 2 = 2 / 2 = 1
    s = math.sqrt(2 / 3)
    want = [0.0, -1 / (s + EPS), 1 / (s + EPS), -1 / (1 + EPS), 1 / (1 + EPS)]
    assert compute_advantages(R, G, "grpo_population_std") == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("name,norm", [("grpo", False), ("grpo_population_std", False),
                                       ("dr_grpo", True), ("dr_grpo", False)])
def test_without_std_division_the_advantage_is_reward_minus_group_mean(name, norm):
    assert compute_advantages(R, G, name, norm_by_std=norm) == pytest.approx([0, -1, 1, -1, 1])


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # group 7: 1 - (0+2)/2 = 0, 0 - (1+2)/2 = -1.5, 2 - (1+0)/2 = 1.5; group 2: 3 - 5, 5 - 3
    want = [0.0, -1.5, 1.5, -2.0, 2.0]
    assert compute_advantages(R, G, "rloo") == pytest.approx(want)
    assert compute_advantages(R, G, "rloo", norm_by_std=False) == pytest.approx(want)


def test_reinforce_pp_baseline_whitens_over_loss_masked_tokens():
    lengths = [1, 2, 1, 3, 1]
    a = np.array([0.0, -1, 1, -1, 1])            # reward - group mean
    tok = np.repeat(a, lengths)                  # each sample counted once per token: 8 tokens
    mean = tok.sum() / 8                         # (0 - 2 + 1 - 3 + 1) / 8 = -3/8
    std = math.sqrt(((tok - mean) ** 2).sum() / 7)
    want = (a - mean) / (std + EPS)
    got = compute_advantages(R, G, "reinforce_pp_baseline", lengths=lengths)
    assert got == pytest.approx(want.tolist(), abs=1e-12)
    assert mean == -0.375


def test_reinforce_pp_baseline_needs_lengths():
    with pytest.raises(ValueError, match="lengths"):
        compute_advantages(R, G, "reinforce_pp_baseline")


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_singleton_and_all_equal_groups_get_zero(name):
    # group 1: one sample; group 2: all equal. A second varied group keeps the whitening defined.
    r, g = [4.0, 2.0, 2.0, 0.0, 1.0], [1, 2, 2, 3, 3]
    got = compute_advantages(r, g, name, lengths=[1] * 5)
    if name == "reinforce_pp_baseline":
        # before whitening: 0, 0, 0, -0.5, 0.5 -> token mean 0, unbiased std sqrt(0.5 / 4)
        s = math.sqrt(0.5 / 4)
        assert got == pytest.approx([0, 0, 0, -0.5 / (s + EPS), 0.5 / (s + EPS)])
    else:
        assert got[:3] == pytest.approx([0, 0, 0], abs=0)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_samples_without_tokens_take_no_part_and_get_zero(name):
    # the 100.0 has no loss-masked token: the group is (1, 3) for every baseline
    with_dead = compute_advantages([1.0, 100.0, 3.0], [0, 0, 0], name, lengths=[2, 0, 2])
    alone = compute_advantages([1.0, 3.0], [0, 0], name, lengths=[2, 2])
    assert with_dead[1] == 0.0
    assert with_dead[[0, 2]] == pytest.approx(alone, abs=0)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_empty_batch_and_all_dead_batch(name):
    assert compute_advantages([], [], name, lengths=[]).shape == (0,)
    assert compute_advantages([1.0, 2.0], [0, 0], name, lengths=[0, 0]).tolist() == [0.0, 0.0]


def test_groups_need_not_be_contiguous():
    # the same two groups interleaved give the same per-sample values
    order = [0, 3, 1, 4, 2]
    r, g = np.array(R)[order], np.array(G)[order]
    assert compute_advantages(r, g, "grpo") == pytest.approx(compute_advantages(R, G, "grpo")[order])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'.*grpo"):
        compute_advantages(R, G, "gae")
    with pytest.raises(ValueError, match="group_index has 2 entries for 5 rewards"):
        compute_advantages(R, [0, 0], "grpo")
    with pytest.raises(ValueError, match="lengths"):
        compute_advantages(R, G, "grpo", lengths=[1, 1, 1, 1, -1])


def test_the_advantages_import_no_torch():
    code = ("import sys; from orchestrator.algo import compute_advantages; "
            "compute_advantages([1.0, 0.0], [0, 0], 'grpo'); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
