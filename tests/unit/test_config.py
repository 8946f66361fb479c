"""Config: YAML + dotted overrides, typed validation, one-line errors naming the field."""
import pytest

from orchestrator.config import DEFAULT_CONFIG, ConfigError, load_config

ROOT = DEFAULT_CONFIG.parent.parent


def test_sim_config_loads_with_overrides():
    cfg = load_config(ROOT / "configs" / "sim.yaml",
                      ["rollout.max_head_offpolicyness=4", "inference.sim.latency=uniform"])
    assert cfg.rollout.max_head_offpolicyness == 4
    assert cfg.inference.sim.latency == "uniform"
    assert cfg.rollout.concurrency == 64


def test_unknown_key_suggests_nearest(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs" / "sim.yaml", ["rollout.consumer_batch_sise=4"])
    assert "unknown config key 'rollout.consumer_batch_sise'" in str(e.value)
    assert "rollout.consumer_batch_size" in str(e.value)


@pytest.mark.parametrize("override, field", [
    ("rollout.consumer_batch_size=0", "rollout.consumer_batch_size"),
    ("run.resume=sometimes", "run.resume"),
    ("inference.sim.latency=gaussian", "inference.sim.latency"),
    ("actor.recompute_logprob=false", "actor"),
    ("run.total_steps=abc", "run.total_steps"),
])
def test_invalid_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs" / "sim.yaml", [override])
    msg = str(e.value)
    assert field in msg and "\n" not in msg


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(ROOT / "configs" / "sim.yaml", ["rollout"])
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="sim"):
        load_config(ROOT / "configs" / "sim.yaml", ["actor.backend=torch"])


def test_resolved_yaml_round_trips():
    cfg = load_config(ROOT / "configs" / "sim.yaml")
    import yaml
    from orchestrator.config import Config
    assert Config.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
