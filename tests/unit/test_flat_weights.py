"""Flat weight layout (orchestrator.backends.model) and trainer <-> inference weight transfer and checkpoints."""
import os

import numpy as np
import pytest
import torch

from orchestrator.config import ActorConfig, InferenceConfig, ModelConfig, RolloutConfig, TaskConfig
from orchestrator.backends.model import build_model, flat_layout, load_flat, write_flat
from orchestrator.data.tokens import build_tokenizer

VOCAB = len(build_tokenizer("copy2"))


def _params_equal(a, b) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_same_seed_builds_identical_models_and_different_seeds_differ():
    cfg = ModelConfig()
    assert _params_equal(build_model(cfg, VOCAB, 3), build_model(cfg, VOCAB, 3))
    assert not _params_equal(build_model(cfg, VOCAB, 3), build_model(cfg, VOCAB, 4))


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expect = torch.rand(3)
    torch.manual_seed(123)
    build_model(ModelConfig(), VOCAB, 0)
    assert torch.equal(torch.rand(3), expect)


def test_layout_is_deterministic_aligned_and_covers_every_parameter():
    m = build_model(ModelConfig(), VOCAB, 0)
    layout = flat_layout(m)
    assert layout == flat_layout(build_model(ModelConfig(), VOCAB, 1))
    names = [s.name for s in layout.slots]
    assert names == [n for n, _ in m.named_parameters()]
    ends = 0
    for s in layout.slots:
        assert s.offset % 64 == 0 and s.offset >= ends
        ends = s.offset + s.nbytes
    assert ends <= layout.nbytes < ends + 64
    assert sum(s.numel for s in layout.slots) == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_exact_and_dtype_preserving(dtype):
    cfg = ModelConfig(dtype=dtype)
    src, dst = build_model(cfg, VOCAB, 0), build_model(cfg, VOCAB, 1)
    layout = flat_layout(src)
    assert all(s.dtype == getattr(torch, dtype) for s in layout.slots)
    buf = bytearray(layout.nbytes)
    write_flat(src, memoryview(buf))
    load_flat(dst, memoryview(bytes(buf)))          # a read-only buffer is fine for loading
    assert _params_equal(src, dst)
    again = bytearray(layout.nbytes)
    write_flat(dst, memoryview(again))
    assert again == buf


def test_flat_bytes_are_the_parameters_in_place():
    m = build_model(ModelConfig(), VOCAB, 0)
    layout = flat_layout(m)
    buf = bytearray(layout.nbytes)
    write_flat(m, memoryview(buf))
    first = layout.slots[0]
    got = np.frombuffer(buf, np.float32, first.numel, first.offset).reshape(first.shape)
    assert np.array_equal(got, dict(m.named_parameters())[first.name].detach().numpy())


def test_wrong_size_or_readonly_buffer_is_rejected():
    m = build_model(ModelConfig(), VOCAB, 0)
    n = flat_layout(m).nbytes
    with pytest.raises(ValueError, match="bytes"):
        load_flat(m, memoryview(bytearray(n - 64)))
    with pytest.raises(ValueError, match="bytes"):
        write_flat(m, memoryview(bytearray(n + 64)))
    with pytest.raises(ValueError, match="writable"):
        write_flat(m, memoryview(bytes(n)))


def _backends(lr=1e-2):
    from orchestrator.backends.torch_inference import TorchInference
    from orchestrator.backends.torch_trainer import TorchTrainer
    mc, tc = ModelConfig(), TaskConfig(name="copy2")
    inf = TorchInference(mc, tc, RolloutConfig(), InferenceConfig(backend="torch"), seed=5)
    tr = TorchTrainer(mc, ActorConfig(backend="torch", lr=lr), tc, seed=5)
    return inf, tr


def test_trainer_and_inference_share_layout_and_initial_weights():
    inf, tr = _backends()
    assert inf.weight_nbytes() == tr.weight_nbytes()
    assert _params_equal(inf.model, tr.model)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(1.0)
    inf.load_weights(7, memoryview(bytearray(tr.weight_nbytes())))   # zeros: weights do change
    assert inf.version == 7 and not _params_equal(inf.model, build_model(ModelConfig(), VOCAB, 5))
    buf = bytearray(tr.weight_nbytes())
    tr.write_weights(memoryview(buf))
    inf.load_weights(8, memoryview(buf))
    assert inf.version == 8 and _params_equal(inf.model, tr.model)


def test_trainer_checkpoint_round_trip(tmp_path):
    from shm.codec import Sequences
    inf, tr = _backends()
    batch = Sequences.build(0, 0, 0, [
        {"prompt": [1, 3, 4, 16], "completion": [3, 4, 2], "logprobs": [-2.9, -2.9, -2.9],
         "advantage": 1.0},
        {"prompt": [1, 5, 6, 16], "completion": [7, 2], "logprobs": [-2.9, -2.9], "advantage": -1.0},
    ])
    tr.train_step(batch)
    tr.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["hf", "optimizer.pt"]
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= \
        set(os.listdir(tmp_path / "hf"))
    _, fresh = _backends()
    fresh.load(str(tmp_path))
    assert _params_equal(fresh.model, tr.model) and fresh.steps == tr.steps == 1
    # identical state -> identical next step
    a, b = tr.train_step(batch), fresh.train_step(batch)
    assert a["loss"] == b["loss"] and _params_equal(fresh.model, tr.model)


def test_weight_nbytes_for_config_matches_a_built_model():
    from orchestrator.config import Config
    from orchestrator.backends.model import weight_nbytes_for
    for dtype in ("float32", "bfloat16"):
        cfg = Config.model_validate({"task": {"name": "copy2"}, "model": {"dtype": dtype}})
        built = build_model(cfg.model, VOCAB, 0)
        assert weight_nbytes_for(cfg) == flat_layout(built).nbytes


def test_cpu_inference_reads_published_weights_straight_into_its_parameters():
    """The CPU torch inference backend's parameters are views of one flat buffer: a read from the
    shared weight buffer into it is the whole reload (no second copy), and the model then computes
    with the trainer's weights, tied embeddings included."""
    from shm.weights import WeightBuffer
    from tests.segments import test_segment
    inf, tr = _backends(lr=0.5)
    target = inf.weights_in_place
    assert target is not None and len(target) == inf.weight_nbytes()
    base = np.frombuffer(target, np.uint8).ctypes.data
    for p in inf.model.parameters():        # every parameter lies inside the buffer
        assert base <= p.data_ptr() < base + len(target)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.mul_(-2.0).add_(0.25)
    wb = WeightBuffer.create(test_segment("weights"), tr.weight_nbytes())
    try:
        wb.publish_from(tr.write_weights, tr.weight_nbytes(), 3)
        got = wb.read_into(target)
        inf.load_weights(got, target)
    finally:
        wb.close()
        wb.unlink()
    assert inf.version == 3 and _params_equal(inf.model, tr.model)
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(inf.model(input_ids=ids).logits, tr.model(input_ids=ids).logits)


def test_bind_flat_keeps_tied_parameters_tied():
    from transformers import LlamaConfig, LlamaForCausalLM
    from orchestrator.backends.model import bind_flat
    m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=2, tie_word_embeddings=True))
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    flat = bind_flat(m)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert all(torch.equal(before[k], v) for k, v in m.named_parameters())
    np.frombuffer(flat, np.uint8)[:] = 0          # writing the buffer writes the weights, both heads
    assert not m.lm_head.weight.any() and not m.model.embed_tokens.weight.any()


@pytest.mark.parametrize("shape", [dict(), dict(hidden_size=24, num_layers=3, num_heads=2),
                                   dict(hidden_size=40, num_layers=1, num_heads=5, dtype="bfloat16"),
                                   dict(hidden_size=8, num_layers=2, num_heads=1, dtype="float16")])
def test_the_torch_free_size_of_the_built_in_model_is_its_flat_layout(shape):
    """The supervisor sizes the weight buffer without torch (backends/tiny_size.py): the size must
    be the flat layout of the model the workers build."""
    from orchestrator.backends.tiny_size import tiny_weight_nbytes
    cfg = ModelConfig(**shape)
    with torch.device("meta"):
        model = build_model(cfg, VOCAB, 0)
    assert tiny_weight_nbytes(cfg, VOCAB) == flat_layout(model).nbytes


def test_sizing_the_built_in_model_for_a_run_imports_no_torch():
    from tests.fresh import fresh_python
    code = ("import sys; from orchestrator.config import load_config; "
            "from orchestrator.runtime.resources import weight_nbytes; "
            "n = weight_nbytes(load_config(None, [])); "
            "print(n, 'torch' in sys.modules)")
    out = fresh_python(code)
    n, torch_imported = out.stdout.split()
    cfg = ModelConfig()
    with torch.device("meta"):
        assert int(n) == flat_layout(build_model(cfg, VOCAB, 0)).nbytes
    assert torch_imported == "False", out.stderr[-2000:]
