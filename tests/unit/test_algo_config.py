"""The `algo` config section and AReaL's actor keys for the recipes: the names offered are the
registries' names, defaults are the original recipe, and combinations that cannot work exit 2
naming both keys (through the real launcher)."""
import subprocess
import sys

import pytest

from orchestrator.algo import AGG_MODES, CORRECTION_LEVELS, CORRECTIONS, ESTIMATORS, POLICY_LOSSES
from orchestrator.config import AlgoConfig, ConfigError, load_config


def _choices(field: str) -> set:
    return set(AlgoConfig.model_fields[field].annotation.__args__)


def test_config_names_are_the_registries_names():
    assert _choices("advantage") == set(ESTIMATORS)
    assert _choices("policy_loss") == set(POLICY_LOSSES)
    assert _choices("loss_agg_mode") == set(AGG_MODES)
    assert _choices("rollout_correction") == set(CORRECTIONS) | {"none"}
    assert _choices("correction_level") == set(CORRECTION_LEVELS)


def test_defaults_are_the_original_recipe():
    cfg = load_config()
    assert cfg.algo.advantage == "grpo_population_std" and cfg.algo.norm_by_std
    assert cfg.algo.policy_loss == "ppo" and cfg.algo.loss_agg_mode == "token-mean"
    assert cfg.algo.rollout_correction == "none"
    assert cfg.actor.eps_clip_higher is None and cfg.actor.c_clip is None


def test_horizon_defaults_to_max_new_tokens_for_the_norm_mode():
    cfg = load_config(None, ["algo.loss_agg_mode=seq-mean-token-sum-norm"])
    assert cfg.algo.loss_horizon == cfg.rollout.max_new_tokens
    cfg = load_config(None, ["algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.loss_horizon=9"])
    assert cfg.algo.loss_horizon == 9


@pytest.mark.parametrize("overrides,names", [
    (["algo.rollout_correction=tis"], ["algo.rollout_correction", "actor.use_decoupled_loss"]),
    (["algo.rollout_correction=mis", "actor.use_decoupled_loss=false", "actor.recompute_logprob=false"],
     ["algo.rollout_correction", "actor.recompute_logprob"]),
    (["actor.c_clip=3.0", "algo.policy_loss=gspo"], ["actor.c_clip", "algo.policy_loss"]),
    (["algo.correction_threshold_low=0.5", "algo.rollout_correction=tis",
      "actor.use_decoupled_loss=false"], ["algo.correction_threshold_low", "algo.rollout_correction"]),
    (["algo.correction_threshold_low=3.0", "algo.rollout_correction=mis",
      "actor.use_decoupled_loss=false"], ["algo.correction_threshold_low", "algo.correction_threshold"]),
    (["algo.loss_horizon=8"], ["algo.loss_horizon", "algo.loss_agg_mode"]),
    (["algo.kl_estimator=k1"], ["algo.kl_estimator", "actor.kl_ctl"]),
    (["actor.ref_dtype=bfloat16"], ["actor.ref_dtype", "actor.kl_ctl"]),
    (["actor.kl_ctl=0.1", "actor.backend=sim", "inference.backend=sim"], ["actor.kl_ctl", "actor.backend"]),
])
def test_combinations_that_cannot_work_name_both_keys(overrides, names):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    for name in names:
        assert name in str(err.value)


def test_ref_path_must_be_a_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="actor.ref_path"):
        load_config(None, ["actor.kl_ctl=0.1", f"actor.ref_path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="actor.ref_path.*actor.kl_ctl"):
        load_config(None, [f"actor.ref_path={tmp_path}"])
    assert load_config(None, ["actor.kl_ctl=0.1", f"actor.ref_path={tmp_path}"]).actor.ref_path == str(tmp_path)


def test_kl_estimator_names_are_the_registrys():
    from orchestrator.algo import KL_ESTIMATORS
    assert _choices("kl_estimator") == set(KL_ESTIMATORS)


@pytest.mark.parametrize("override", ["actor.c_clip=1.0", "algo.advantage=gae",
                                      "algo.loss_agg_mode=seq-mean", "actor.eps_clip_higher=0"])
def test_bad_values_are_refused(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])


def test_the_launcher_exits_2_naming_both_keys(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'r'}",
                           "algo.rollout_correction=tis"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "algo.rollout_correction" in proc.stderr and "actor.use_decoupled_loss" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()
