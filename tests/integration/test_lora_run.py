"""A LoRA run end to end (issue #25 items 2-4): the default job on a model directory with
actor.lora, kill -9 of the supervisor past a checkpoint, resume to the end: steps and prompts
exactly once, every step's logprob_diff (trainer vs the engine on the merged weights it was
published) within the float32 bound, checkpoints holding only the adapters. Then
`python -m orchestrator.export` writes the merged model (transformers loads it) and, with
`--adapter`, the peft adapter (peft loads it on the base): both give the trainer's logits. Last, the
model directory's weights are replaced: the resume and the merged export exit 2 naming both hashes.
Real processes, a real model directory, real files."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from orchestrator.run import checkpoint
from tests.integration.lifecycle import (ROOT, all_gone, descendants, events, run, start, steps,
                                         trained_prompt_ids, wait_for_step)

STEPS = 24


def _export(run_dir, out, *args):
    return subprocess.run([sys.executable, "-m", "orchestrator.export", str(run_dir), str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow    # ~2 min on 2 busy cores; test_lora.py checks each piece in the default suite
def test_lora_run_survives_kill_9_and_exports_merged_and_adapter(tmp_path, hf_model_dir):
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = tmp_path / "model"
    shutil.copytree(hf_model_dir, model)
    run_dir = tmp_path / "run"
    args = (f"model.path={model}", "actor.lora.rank=8", f"run.total_steps={STEPS}",
            "run.checkpoint_every=3", "eval.every_steps=0", "run.progress=false",
            "rollout.max_head_offpolicyness=0")   # every batch sampled by the weights it trains:
    # each step measures logprob_diff (async, a run resumed past step 3 may train no batch whose
    # tokens the current weights sampled, and so measure none after the resume)
    proc = start(run_dir, *args, config="configs/default.yaml")
    wait_for_step(proc, run_dir, 4, timeout=240)
    deadline = time.monotonic() + 120
    while not checkpoint.committed(str(run_dir)):       # the step-3 checkpoint commits in the background
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint committed"
        time.sleep(0.05)
    kids = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert all_gone(kids, timeout=30) == []

    out = run(run_dir, *args, config="configs/default.yaml", timeout=300)
    assert out.returncode == 0, out.stderr
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, STEPS + 1))
    resumes = events(run_dir, "resume")
    assert len(resumes) == 1 and 3 <= resumes[0]["step"] < STEPS, resumes   # killed mid-run
    assert lines[resumes[0]["step"]]["resumed"]
    ids = trained_prompt_ids(run_dir, STEPS)            # one per sample: group_size per prompt
    assert ids == sorted(list(range(8 * STEPS)) * 16)    # every prompt trained once, none lost
    diffs = {s["step"]: s["logprob_diff_mean"] for s in lines if s.get("logprob_diff_mean") is not None}
    assert any(k > resumes[0]["step"] for k in diffs) and max(diffs.values()) < 1e-3   # the merged
    # weights inference sampled from are the trainer's, before the kill and after the resume

    ckpt = run_dir / "checkpoints" / f"step_{STEPS:08d}" / "trainer"
    assert sorted(os.listdir(ckpt)) == ["adapter", "optimizer.pt"]
    assert sorted(os.listdir(ckpt / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]
    base_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    assert (ckpt / "adapter" / "adapter_model.safetensors").stat().st_size < 0.5 * base_bytes

    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert _export(run_dir, merged_dir).returncode == 0
    assert _export(run_dir, adapter_dir, "--adapter").returncode == 0
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), adapter_dir).eval()

    from orchestrator.backends.torch_trainer import TorchTrainer
    from orchestrator.config import load_config
    cfg = load_config("configs/default.yaml", [*args, f"run.dir={run_dir}"])
    trainer = TorchTrainer(cfg.model, cfg.actor, cfg.task, seed=cfg.run.seed, algo=cfg.algo)
    trainer.load(str(ckpt))
    ids = torch.tensor([[1, 5, 9, 30, 41, 7, 12, 2]])
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(model)(input_ids=ids).logits
        assert (want - base).abs().max() > 1e-4          # the adapters did train
        for got in (merged(input_ids=ids).logits, adapted(input_ids=ids).logits):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)

    # another base at the same path: refused by resume and by the merged export, naming both hashes
    from tests.hf_model import build_hf_model_dir
    torch.manual_seed(1)
    other = build_hf_model_dir(tmp_path / "other")
    shutil.copy(other / "model.safetensors", model / "model.safetensors")
    out = run(run_dir, *args[:2], f"run.total_steps={STEPS + 2}", *args[3:],
              config="configs/default.yaml", timeout=300)
    assert out.returncode == 2, out.stderr
    assert "another base model" in out.stderr and out.stderr.count("weights hash") == 2
    refused = _export(run_dir, tmp_path / "merged2")
    assert refused.returncode == 2 and "another base" in refused.stderr
    assert not (tmp_path / "merged2").exists()
