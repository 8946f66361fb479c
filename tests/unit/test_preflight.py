"""Ring sizes follow the config and bound every real record; preflight refuses what this machine
cannot run (absent devices, CPU oversubscription, records over the cap, /dev/shm too small)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator import messages
from orchestrator.runtime import preflight
from orchestrator.backends.base import GenRequest
from orchestrator.backends.sim_inference import SimInference
from orchestrator.runtime.resources import (BATCH_RING_BYTES, CTL_RING_BYTES, OUT_RING_BYTES, REQ_RING_BYTES,
                                   RingSizes, ring_sizes, shm_need, weight_nbytes)
from orchestrator.config import ConfigError, load_config
from shm import codec
from shm.ring import Ring
from shm.segments import SHM_DIR
from shm.weights import WeightBuffer

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "configs" / "sim.yaml"
LONG = ["rollout.consumer_batch_size=4", "rollout.group_size=3", "rollout.max_new_tokens=300",
        "inference.sim.completion_tokens=500", "inference.sim.prompt_tokens=40"]


def _name(tag: str) -> str:
    return f"/arl_{os.getpid()}-pf_{tag}"


def test_small_configs_keep_the_fixed_sizes():
    for cfg in (load_config(SIM), load_config(None)):
        s = ring_sizes(cfg)
        assert (s.req, s.out, s.ctl, s.batch) == (REQ_RING_BYTES, OUT_RING_BYTES, CTL_RING_BYTES,
                                                  BATCH_RING_BYTES)
    assert RingSizes().batch == BATCH_RING_BYTES


def test_sizes_bound_the_records_the_sim_backend_really_makes():
    cfg = load_config(SIM, LONG)
    s = ring_sizes(cfg)
    assert (s.prompt_tokens, s.completion_tokens) == (40, 300)     # sim emits min(300, 500)
    t = iter(np.arange(0.0, 100.0, 0.5))
    sim = SimInference(cfg.inference.sim, seed=0, clock=lambda: float(next(t)))
    prompt = np.arange(40, dtype=np.int32)
    groups = []
    for rid in range(4):
        sim.add(GenRequest(rid, rid, prompt, 3, 300, 1.0))
        groups += [r.sequences for r in sim.step(0.0)]
        groups += [r.sequences for r in sim.step(0.0)]
    assert len(groups) == 4 and groups[0].T == 3 * 340
    assert max(codec.encoded_size(g) for g in groups) <= s.group_bytes
    batch = codec.concat(groups, kind=2, ident=1, version=0)
    assert codec.encoded_size(batch) <= s.batch_bytes <= s.batch
    gen = messages.Generate(request_id=123, prompt_id=7, prompt_tokens=prompt.tolist(), n=3,
                            max_new_tokens=300, temperature=0.7)
    assert len(messages.encode(gen)) <= s.generate_bytes


def test_long_context_sizes_grow_past_the_minimums():
    cfg = load_config(SIM, ["rollout.consumer_batch_size=32", "rollout.group_size=16",
                            "rollout.max_new_tokens=8192", "inference.sim.completion_tokens=8192"])
    s = ring_sizes(cfg)
    assert s.batch_bytes > BATCH_RING_BYTES and s.batch >= Ring.record_space(s.batch_bytes)
    assert s.out >= 4 * Ring.record_space(s.group_bytes)


def test_record_space_is_exactly_what_a_ring_needs():
    n = 100_000
    with Ring.create(_name("fit"), Ring.record_space(n)) as ring:
        ring.put(bytes(n), timeout=0)
        assert len(ring.get(timeout=0)) == n
        ring.unlink()
    with Ring.create(_name("tight"), Ring.record_space(n) - 64) as ring:
        with pytest.raises(ValueError, match="can never fit"):
            ring.put(bytes(n), timeout=0)
        ring.unlink()


def test_shm_bytes_match_the_files_created():
    def used(name):
        return sum(os.stat(os.path.join(SHM_DIR, f)).st_blocks * 512 for f in os.listdir(SHM_DIR)
                   if name.lstrip("/") in f)

    with Ring.create(_name("size"), 3 << 20) as ring:
        assert used(ring.name) <= Ring.shm_bytes(3 << 20)
        assert os.stat(os.path.join(SHM_DIR, ring.name.lstrip("/"))).st_size > 3 << 20
        ring.unlink()
    with WeightBuffer.create(_name("w"), 100_000) as wb:
        assert used(wb.name) <= WeightBuffer.shm_bytes(100_000)
        assert os.stat(os.path.join(SHM_DIR, wb.name.lstrip("/"))).st_size == \
            WeightBuffer.shm_bytes(100_000)
        wb.unlink()


def test_shm_need_counts_weights_twice_and_a_spare_worker():
    cfg = load_config(SIM, ["actor.sim.weight_bytes=10000000", "inference.num_workers=2"])
    need = shm_need(cfg, ring_sizes(cfg), weight_nbytes(cfg))
    assert need["weights"] >= 2 * 10_000_000
    assert need["rollout rings"] == 3 * Ring.shm_bytes(OUT_RING_BYTES)      # 2 + 1 spare
    cfg = load_config(SIM, ["inference.on_worker_death=fail"])
    assert shm_need(cfg, ring_sizes(cfg), 8)["rollout rings"] == 2 * Ring.shm_bytes(OUT_RING_BYTES)


def test_preflight_refuses_too_little_shm_naming_what_drives_it(monkeypatch):
    cfg = load_config(SIM, ["rollout.consumer_batch_size=64", "rollout.group_size=16",
                            "rollout.max_new_tokens=4096", "inference.sim.completion_tokens=4096"])
    preflight.check_machine(cfg)
    monkeypatch.setattr(preflight, "shm_free", lambda path: 64 << 20)
    with pytest.raises(ConfigError) as e:
        preflight.check_machine(cfg)
    msg = str(e.value)
    assert "/dev/shm" in msg and "\n" not in msg
    for field in ("rollout.consumer_batch_size=64", "rollout.group_size=16",
                  "rollout.max_new_tokens=4096"):
        assert field in msg, msg


def test_preflight_refuses_a_record_over_the_cap():
    cfg = load_config(SIM, ["rollout.group_size=4096", "rollout.max_new_tokens=65536",
                            "inference.sim.completion_tokens=65536"])
    with pytest.raises(ConfigError, match="rollout-group record .* rollout.group_size=4096"):
        preflight.check_machine(cfg)


def test_preflight_devices(monkeypatch):
    monkeypatch.setattr(preflight, "gpu_count", lambda: 2)
    ok = load_config(None, ["inference.devices=['0']", "actor.device='1'"])
    preflight._check_devices(ok)
    for overrides, field in ((["inference.devices=['2']"], "inference.devices"),
                             (["actor.device='5'"], "actor.device")):
        with pytest.raises(ConfigError, match=f"'{field}': CUDA device .* does not exist .*2 CUDA"):
            preflight._check_devices(load_config(None, overrides))
    monkeypatch.setattr(preflight, "gpu_count", lambda: 0)
    with pytest.raises(ConfigError, match="no CUDA device"):
        preflight._check_devices(ok)


def test_preflight_cpus(monkeypatch):
    monkeypatch.setattr(preflight, "cpu_count", lambda: 2)
    preflight._check_cpus(load_config(SIM))                       # 2 workers + trainer on 2 CPUs
    preflight._check_cpus(load_config(SIM, ["inference.num_workers=15"]))           # 16 threads
    with pytest.raises(ConfigError, match="inference.num_workers=16 .* 17 CPU threads on 2 CPUs"):
        preflight._check_cpus(load_config(SIM, ["inference.num_workers=16"]))
    with pytest.raises(ConfigError, match="actor.threads=16"):
        preflight._check_cpus(load_config(None, ["actor.threads=16"]))
    # GPU inference workers use no CPU threads of their own
    preflight._check_cpus(load_config(None, ["inference.devices=['0','1']", "inference.num_workers=2",
                                             "inference.threads_per_worker=64"]))


def test_preflight_imports_no_torch_without_a_device():
    code = ("import sys; from orchestrator.config import load_config; "
            "from orchestrator.runtime.preflight import check_machine; "
            "check_machine(load_config('configs/sim.yaml')); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_one_reader_of_a_model_directorys_context_length(tmp_path):
    """Preflight and the episode budget read the context length the same way (data.budgets'
    context_of): max_position_embeddings, else GPT-2's n_positions, else max_seq_len; a bool or a
    non-positive value is no length."""
    import json
    from types import SimpleNamespace
    from orchestrator.data.budgets import context_of, model_context as budget_context
    from orchestrator.runtime.preflight import model_context
    assert context_of({"max_position_embeddings": 2048, "n_positions": 1024}) == (2048, "max_position_embeddings")
    assert context_of({"max_position_embeddings": True, "n_positions": 1024}) == (1024, "n_positions")
    assert context_of({"max_seq_len": 0}) is None
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": 1024}))
    cfg = SimpleNamespace(inference=SimpleNamespace(backend="torch"),
                          model=SimpleNamespace(path=str(tmp_path), max_seq_len=64))
    assert model_context(cfg) == (1024, f"n_positions of model.path={tmp_path}")
    assert budget_context(cfg) == 1024
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_context(cfg) == (64, "model.max_seq_len")
