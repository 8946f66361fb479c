"""`actor.lora` (issue #25 item 1): typed, documented, validated before anything starts; unset is
full fine-tuning. Nonsense is one line naming the key: rank < 1, a layer the model does not have
(the built-in model by config, a model.path directory by preflight from its safetensors headers),
LoRA with the sim trainer, a misspelt key (named before the field it leaves missing)."""
import json
import struct

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.runtime import preflight


def _refused(*overrides, path=None) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path, list(overrides))
    return str(exc.value)


def test_unset_is_full_fine_tuning_and_rank_alone_is_enough():
    assert load_config(None, []).actor.lora is None
    lora = load_config(None, ["actor.lora.rank=8"]).actor.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (8, None, 0.0, "all-linear")
    assert (lora.lr_scale, lora.loraplus_lr_ratio) == (10.0, 16.0)     # the field's rules (#39)
    # alpha's default follows the width: sqrt(hidden_size), 8 for the built-in 64, 64 at 4096
    assert (lora.resolved_alpha(64), lora.resolved_alpha(4096)) == (8.0, 64.0)
    lora = load_config(None, ["actor.lora.rank=4", "actor.lora.alpha=8",
                              "actor.lora.target_modules=[q_proj,v_proj]"]).actor.lora
    assert (lora.resolved_alpha(4096), lora.target_modules) == (8.0, ["q_proj", "v_proj"])


@pytest.mark.parametrize("overrides, names", [
    (["actor.lora.rank=0"], "'actor.lora.rank'"),
    (["actor.lora.rank=8.0"], "'actor.lora.rank'"),
    (["actor.lora.rank=8", "actor.lora.alpha=0"], "'actor.lora.alpha'"),
    (["actor.lora.rank=8", "actor.lora.dropout=1.0"], "'actor.lora.dropout'"),
    (["actor.lora.rank=8", "actor.lora.lr_scale=0"], "'actor.lora.lr_scale'"),
    (["actor.lora.rank=8", "actor.lora.loraplus_lr_ratio=0.5"], "'actor.lora.loraplus_lr_ratio'"),
    (["actor.lora.rank=8", "actor.lora.target_modules=[]"], "'actor.lora.target_modules'"),
    (["actor.lora.rank=8", "actor.lora.target_modules=q_proj"], "'actor.lora.target_modules'"),
    (["actor.lora.rank=8", "actor.lora.target_modules=[q_proj,qkv_proj]"], "qkv_proj"),
    (["actor.lora.rnak=8"], "did you mean 'actor.lora.rank'"),
    (["actor.lora.alpha=8"], "'actor.lora.rank': Field required"),
])
def test_nonsense_is_one_line_naming_the_key(overrides, names):
    msg = _refused(*overrides)
    assert names in msg and "\n" not in msg


def test_lora_with_the_sim_trainer_names_both_keys():
    msg = _refused("actor.lora.rank=8", path="configs/sim.yaml")
    assert "actor.lora" in msg and "actor.backend sim" in msg


def _model_dir(tmp_path, layers):
    """A model directory whose only content preflight reads: config.json and a safetensors header."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    header = {f"model.layers.0.{n}.weight": {"dtype": "F32", "shape": [4, 4],
                                              "data_offsets": [64 * i, 64 * (i + 1)]}
              for i, n in enumerate(layers)}
    header["model.norm.weight"] = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(64 * len(layers)))
    return d


def test_preflight_reads_a_model_dirs_layer_names_from_its_headers(tmp_path):
    d = _model_dir(tmp_path, ["self_attn.q_proj", "self_attn.c_attn", "mlp.down_proj"])
    assert preflight.weight_layers(str(d)) == {"q_proj", "c_attn", "down_proj"}   # norm is 1-D

    cfg = load_config(None, [f"model.path={d}", "actor.lora.rank=8",
                             "actor.lora.target_modules=[c_attn,down_proj]"])
    preflight._check_lora(cfg)                       # its own names pass, where the tiny model's would not
    cfg = load_config(None, [f"model.path={d}", "actor.lora.rank=8",
                             "actor.lora.target_modules=[q_proj,v_proj]"])
    with pytest.raises(ConfigError, match=r"actor.lora.target_modules.*\['v_proj'\].*c_attn, down_proj, q_proj"):
        preflight._check_lora(cfg)


def test_adapter_only_vllm_needs_lora_and_the_vllm_backend():
    """inference.vllm.lora (issue #25 item 2): off by default; without actor.lora or with another
    inference backend it is one line naming what it needs (exit 2 before anything starts)."""
    assert load_config(None, []).inference.vllm.lora is False
    ok = load_config(None, ["actor.backend=torch", "inference.backend=vllm", "actor.lora.rank=8",
                            "inference.vllm.lora=true"])
    assert ok.inference.vllm.lora is True
    msg = _refused("actor.backend=torch", "inference.backend=vllm", "inference.vllm.lora=true")
    assert "inference.vllm.lora=true needs actor.lora (" in msg and "\n" not in msg
    msg = _refused("actor.backend=torch", "inference.backend=torch", "actor.lora.rank=8",
                   "inference.vllm.lora=true")
    assert "inference.vllm.lora=true needs inference.backend=vllm (" in msg and "\n" not in msg
    msg = _refused("inference.vllm.lora=true", path="configs/sim.yaml")
    assert "needs actor.lora and inference.backend=vllm" in msg


def test_the_resolved_rates_and_alpha_are_said_at_start(tmp_path):
    """#39: a LoRA run's rates differ from actor.lr and its alpha follows the width: the launcher
    says them (`note:`), from the built-in model's hidden_size or model.path's config.json."""
    import json

    from orchestrator.runtime.preflight import _check_lora

    cfg = load_config(None, ["actor.lora.rank=8", "actor.lr=2e-4"])
    _check_lora(cfg)
    assert cfg.said == ["actor.lora: B trains at 0.002 (actor.lr 0.0002 x lr_scale 10), A at "
                        "0.000125 (/ loraplus_lr_ratio 16), alpha 8 (sqrt of hidden_size 64)"]
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096}))
    cfg = load_config(None, ["actor.lora.rank=8", f"model.path={tmp_path}",
                             "actor.lora.loraplus_lr_ratio=1"])
    _check_lora(cfg)
    assert cfg.said[-1].endswith("A at 0.01 (/ loraplus_lr_ratio 1), alpha 64 (sqrt of hidden_size 4096)")
    cfg = load_config(None, ["actor.lora.rank=8", "actor.lora.alpha=16"])
    _check_lora(cfg)
    assert "alpha" not in cfg.said[-1]
