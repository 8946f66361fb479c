"""GPU weight hand-off over CUDA IPC handles (marked gpu: skipped without CUDA)."""
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest

from shm.cuda_ipc import open_blob
from tests.segments import test_segment

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_blob_validation_without_gpu():
    with pytest.raises(ValueError, match="truncated"):
        open_blob(b"AR", 0)
    with pytest.raises(ValueError, match="bad magic"):
        open_blob(b"XXXX" + bytes(8) + b"junk", 0)


def _reader(name, expect_version, nbytes, q):
    import torch as t
    from shm.cuda_ipc import open_blob as ob
    from shm.weights import WeightBuffer
    wb = WeightBuffer.attach(name)
    buf = bytearray(wb.nbytes)
    got = wb.read_into(memoryview(buf), timeout=30)
    version, tensor = ob(bytes(buf), device_index=0)
    q.put((got, version, int(tensor.sum().item()), tensor.numel()))
    del tensor
    t.cuda.synchronize()
    wb.close()


@pytest.mark.gpu
def test_publish_and_open_across_processes():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from shm.cuda_ipc import CudaIpcPublisher
    from shm.weights import WeightBuffer
    name = test_segment("ipc")
    wb = WeightBuffer.create(name, 1 << 16)
    try:
        pub = CudaIpcPublisher("cuda:0")
        blob = pub.publish(7, 1 << 20, lambda t: t.fill_(3))
        wb.publish(blob, 7)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_reader, args=(name, 7, 1 << 20, q))
        p.start()
        got, version, total, n = q.get(timeout=120)
        p.join(60)
        assert (got, version, n, total) == (7, 7, 1 << 20, 3 * (1 << 20))
        assert pub.live_versions == [7]
        assert pub.release_below(8) == 1 and pub.live_versions == []
    finally:
        wb.close()
        wb.unlink()


@pytest.mark.gpu
def test_end_to_end_on_two_gpus(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (inference and trainer on disjoint GPUs)")
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path}",
                          "run.total_steps=20", "inference.devices=['0']", "actor.device='1'",
                          "eval.every_steps=0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2])
def test_trainer_ranks_on_gpus_publish_over_cuda_ipc(tmp_path, ranks):
    """FSDP2 over NCCL on actor.devices (world 1, and 2 where there are three GPUs), bf16, CUDA IPC
    publish from rank 0 to a GPU inference worker: the run trains, and inference samples from the
    trained weights (logprob mismatch below the configured limit)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < ranks + 1:
        pytest.skip(f"needs {ranks + 1} CUDA devices (inference plus {ranks} trainer rank(s))")
    devices = [str(1 + r) for r in range(ranks)]
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path}",
                          "run.total_steps=20", "inference.devices=['0']", f"actor.devices={devices}",
                          "actor.sharding=fsdp", "actor.micro_batch_tokens=512",
                          "actor.param_dtype=bfloat16", "actor.logprob_diff_limit=0.1",
                          "rollout.max_head_offpolicyness=0", "eval.every_steps=0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "step_00000020" / "trainer" / "dcp").is_dir()
