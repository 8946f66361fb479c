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


# ------------------------------------------------------------------ strict input (issue #8 item 15)

def test_every_shipped_config_loads_and_round_trips():
    import yaml
    from orchestrator.config import Config
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert Config.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
        assert Config.model_validate(cfg.model_dump(mode="json")) == cfg     # what workers do


@pytest.mark.parametrize("text, key, line", [
    ("run:\n  seed: 1\n  seed: 2\n", "run.seed", 3),
    ("run:\n  seed: 1\nrollout: {}\nrun:\n  seed: 2\n", "run", 4),
    ("inference:\n  sim:\n    latency_s: 0.1\n    latency_s: 0.2\n", "inference.sim.latency_s", 4),
    ("inference:\n  devices: [{a: 1, a: 2}]\n", "inference.devices.0.a", 2),
])
def test_duplicate_keys_are_refused_at_any_depth(tmp_path, text, key, line):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert f"duplicate key '{key}' at line {line}" in msg and str(path) in msg and "\n" not in msg


def test_duplicate_keys_in_an_override_value():
    with pytest.raises(ConfigError, match="override 'run': duplicate key 'seed'"):
        load_config(ROOT / "configs" / "sim.yaml", ["run={seed: 1, seed: 2}"])


def test_anchors_and_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("run: &r {seed: 3, total_steps: 4}\neval:\n  every_steps: 2\n"
                    "rollout: {<<: {group_size: 2}, group_size: 4}\n")
    cfg = load_config(path)
    assert cfg.run.seed == 3 and cfg.rollout.group_size == 4


def test_config_file_must_be_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  dir: runs/caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at line 2\)") as e:
        load_config(path)
    assert str(path) in str(e.value)
    (tmp_path / "utf8.yaml").write_text("run:\n  dir: runs/caf\u00e9\n", encoding="utf-8")
    assert load_config(tmp_path / "utf8.yaml").run.dir == "runs/caf\u00e9"


def test_huge_config_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("actor:\n  lr: 3e-4\n  max_grad_norm: 1E1\n")
    cfg = load_config(path, ["actor.eps_clip=2e-1"])
    assert (cfg.actor.lr, cfg.actor.max_grad_norm, cfg.actor.eps_clip) == (3e-4, 10.0, 0.2)


@pytest.mark.parametrize("override, field", [
    ("run.total_steps=true", "run.total_steps"),          # bool is not an int
    ("run.total_steps=3.0", "run.total_steps"),           # nor is a float, even a whole one
    ("run.total_steps='3'", "run.total_steps"),           # nor a string
    ("actor.lr=true", "actor.lr"),                        # bool is not a number
    ("actor.lr='0.1'", "actor.lr"),
    ("run.progress=1", "run.progress"),                   # 1 is not a bool
    ("run.progress='true'", "run.progress"),
    ("task.name=5", "task.name"),                         # an int is not a string
    ("rollout.max_concurrent_rollouts=false", "rollout.max_concurrent_rollouts"),
    ("inference.devices=[true]", "inference.devices"),
])
def test_no_coercion_across_bool_int_float_str(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs" / "sim.yaml", [override])
    assert f"'{field}" in str(e.value) and "expected" in str(e.value)


def test_ints_are_taken_where_floats_belong():
    cfg = load_config(ROOT / "configs" / "sim.yaml", ["run.shutdown_timeout_s=5", "actor.lr=1"])
    assert cfg.run.shutdown_timeout_s == 5.0 and isinstance(cfg.run.shutdown_timeout_s, float)


@pytest.mark.parametrize("override, field", [
    ("run.shutdown_timeout_s=.inf", "run.shutdown_timeout_s"),
    ("actor.lr=.nan", "actor.lr"),
    ("actor.behav_imp_weight_cap=.inf", "actor.behav_imp_weight_cap"),
    ("inference.sim.reload_delay_s=.inf", "inference.sim.reload_delay_s"),
    ("rollout.temperature=-.inf", "rollout.temperature"),
])
def test_inf_and_nan_are_refused(override, field):
    with pytest.raises(ConfigError, match=f"'{field}': must be a finite number"):
        load_config(ROOT / "configs" / "sim.yaml", [override])


@pytest.mark.parametrize("override, field", [
    ("inference.num_workers=257", "inference.num_workers"),
    ("inference.threads_per_worker=1025", "inference.threads_per_worker"),
    ("actor.threads=1025", "actor.threads"),
    ("rollout.queue_size=2000000", "rollout.queue_size"),
    ("rollout.max_concurrent_rollouts=2000000", "rollout.max_concurrent_rollouts"),
    ("rollout.consumer_batch_size=65537", "rollout.consumer_batch_size"),
    ("rollout.group_size=65537", "rollout.group_size"),
    ("rollout.max_new_tokens=1048577", "rollout.max_new_tokens"),
    ("run.total_steps=100000000", "run.total_steps"),
    ("run.shutdown_timeout_s=3601", "run.shutdown_timeout_s"),
    ("run.startup_timeout_s=86401", "run.startup_timeout_s"),
    ("weights.sync_timeout_s=86401", "weights.sync_timeout_s"),
    ("run.seed=-1", "run.seed"),
    ("actor.sim.weight_bytes=1099511627777", "actor.sim.weight_bytes"),
])
def test_absurd_sizes_and_counts_are_refused(override, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        load_config(ROOT / "configs" / "sim.yaml", [override])


def test_every_bound_has_its_reason_documented():
    from orchestrator.config import Config
    from pydantic import BaseModel

    def walk(model):
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                yield from walk(ann)
            else:
                yield name, f

    for name, f in walk(Config):
        assert f.description, f"{name} is undocumented"


@pytest.mark.parametrize("overrides, needle", [
    (["inference.num_workers=2", "inference.devices=['0','0']"], "inference.devices lists device '0' twice"),
    (["inference.num_workers=2", "inference.devices=['0','1','2']"], "inference.num_workers=2"),
    (["inference.num_workers=2", "inference.devices=['0']"], "inference.num_workers=2"),
    (["inference.devices=['gpu0']"], "'inference.devices': 'gpu0' is not a CUDA device index"),
    (["inference.devices=['-1']"], "'inference.devices'"),
    (["inference.devices=['01']"], "'inference.devices'"),
    (["actor.device=''"], "'actor.device'"),
    (["actor.device='cuda:0'"], "'actor.device'"),
    (["actor.device=-1"], "'actor.device'"),
])
def test_bad_device_lists(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert needle in str(e.value)


def test_device_indices_may_be_yaml_ints():
    cfg = load_config(None, ["inference.devices=[0, 1]", "inference.num_workers=2", "actor.device=2"])
    assert cfg.inference.devices == ["0", "1"] and cfg.actor.device == "2"


@pytest.mark.parametrize("override, field", [
    ("inference.devices=['0']", "inference.devices"), ("actor.device='0'", "actor.device")])
def test_sim_backends_take_no_device(override, field):
    with pytest.raises(ConfigError, match=f"{field}.* sim"):
        load_config(ROOT / "configs" / "sim.yaml", [override])


# ------------------------------------------------------------------ trainer ranks (actor.devices / num_ranks)

def test_trainer_ranks_layout():
    cfg = load_config(None, ["actor.backend=torch", "inference.backend=torch", "actor.num_ranks=2"])
    assert (cfg.actor.world_size, cfg.actor.strategy, cfg.actor.rank_devices) == (2, "fsdp", [])
    cfg = load_config(None, ["actor.backend=torch", "inference.backend=torch",
                             "actor.devices=[4, 5, 6, 7]", "inference.devices=[0, 1]",
                             "inference.num_workers=2", "actor.sharding=ddp"])
    assert (cfg.actor.world_size, cfg.actor.strategy) == (4, "ddp")
    assert cfg.actor.rank_devices == ["4", "5", "6", "7"] and cfg.gpu_weights
    assert load_config(None, []).actor.strategy == "none"


@pytest.mark.parametrize("overrides,needle", [
    (["actor.devices=['1', '1']"], "listed twice"),
    (["actor.devices=['0']", "inference.devices=['0']"], "overlaps inference.devices"),
    (["actor.devices=['1', '2']", "actor.device='3'"], "set one"),
    (["actor.devices=['1', '2']", "actor.num_ranks=3"], "one rank per device"),
    (["actor.device='1'", "actor.num_ranks=2"], "actor.devices"),
    (["actor.num_ranks=2", "actor.sharding=none"], "actor.sharding=none"),
    (["actor.devices=['x']"], "actor.devices"),
])
def test_bad_trainer_ranks(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor.backend=torch", "inference.backend=torch", *overrides])
    assert needle in str(err.value)


def test_sim_trainer_is_one_rank():
    with pytest.raises(ConfigError, match="actor.backend torch"):
        load_config(None, ["actor.backend=sim", "inference.backend=sim", "actor.num_ranks=2"])


def test_hard_age_bound_is_at_least_the_gate():
    assert load_config(None, ["rollout.max_observed_offpolicyness=2"]).rollout.max_observed_offpolicyness == 2
    with pytest.raises(ConfigError, match="below max_head_offpolicyness"):
        load_config(None, ["rollout.max_observed_offpolicyness=1"])


@pytest.mark.parametrize("overrides,needle", [
    (["inference.backend=torch", "inference.vllm.tensor_parallel_size=2"], "tensor parallel is vLLM's"),
    (["inference.backend=vllm", "inference.vllm.tensor_parallel_size=2", "inference.num_workers=2",
      "inference.devices=['0','1']"], "gets 1 of inference.devices: give every worker 2 devices"),
    (["inference.backend=vllm", "inference.vllm.tensor_parallel_size=0"], "tensor_parallel_size"),
])
def test_bad_tensor_parallel(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor.backend=torch", *overrides])
    assert needle in str(err.value)


def test_tensor_parallel_ranks_read_the_shared_buffer():
    """T > 1 keeps one inference worker's devices as its ranks; weights go through the shm buffer
    (CUDA IPC is one rank's path) even with the trainer on a GPU."""
    cfg = load_config(None, ["actor.backend=torch", "inference.backend=vllm", "actor.device=4",
                             "inference.devices=['0','1','2','3']", "inference.num_workers=2",
                             "inference.vllm.tensor_parallel_size=2"])
    assert cfg.inference.vllm.tensor_parallel_size == 2 and not cfg.gpu_weights
    assert load_config(None, ["actor.backend=torch", "inference.backend=vllm", "actor.device=4",
                              "inference.devices=['0','1']", "inference.num_workers=2"]).gpu_weights
