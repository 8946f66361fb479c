"""scripts/kill_resume.py: kill -9 the supervisor in every phase of a run (startup, recovery, steady
state, checkpoints, drain), resume, and check recovery; and its checker catches a broken run dir."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.lifecycle import ROOT, assert_episodes_redone, soak

PHASES = {"startup", "recovery", "steady", "checkpoint", "drain"}


def load():
    spec = importlib.util.spec_from_file_location("kill_resume", ROOT / "scripts" / "kill_resume.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod            # its dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def assert_recovered(out, result):
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1) + out.stderr
    assert result["failures"] == [] and result["final_returncode"] == 0
    rounds = result["rounds"]
    assert {r["phase"] for r in rounds} == PHASES
    for phase in PHASES - {"drain"}:   # a drain may finish before its kill -9: then it exits 143
        assert any(r["killed"] for r in rounds if r["phase"] == phase), phase
    assert all(r["children_alive_after_5s"] == 0 for r in rounds)
    assert result["steps_contiguous"] and result["final_step_is_target"]
    assert result["prompts_exactly_once"]
    assert result["bound_kept_on_resume"] and result["shm_leftovers"] == []
    assert result["resumes"] >= 1 and result["resumed_steps"]


def test_kill_resume_soak_covers_every_phase(tmp_path):
    # --kills 6: the first 5 rounds are a seeded permutation of the 5 phases
    out, result = soak(tmp_path, "--kills", "6", "--seed", "1", "--hang-timeout", "30",
                       "--timeout", "120", "--drain-window", "0.5",
                       "run.total_steps=60", "run.checkpoint_every=5", "actor.sim.step_time_s=0.03")
    assert_recovered(out, result)


@pytest.mark.slow            # a soak: the sim and two-rank soaks run in the default suite
def test_kill_resume_with_a_dataset_keeps_prompts_exactly_once(tmp_path):
    """The generic path: a JSONL dataset, the tiny torch model and the digits reward; a stream of
    fewer prompts than the run trains (epochs wrap) survives kills in steady state, at checkpoints
    and during recovery with every prompt trained exactly once."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i:02d}>", "answer": f"{i:02d}"}) + "\n"
                            for i in range(100)))
    out, result = soak(tmp_path, "--kills", "3", "--seed", "1", "--phases",
                       "steady,checkpoint,recovery", "--hang-timeout", "60", "--timeout", "120",
                       "run.total_steps=30", "run.checkpoint_every=5", "task.name=dataset",
                       f"task.dataset={data}", "task.reward=digits", "eval.every_steps=0",
                       "task.num_train_prompts=150", config="configs/default.yaml")
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1)
    assert result["resumes"] >= 1 and result["final_step_is_target"] and result["steps_contiguous"]
    assert result["prompts_exactly_once"] and result["shm_leftovers"] == []


@pytest.mark.slow            # a soak: the sim and two-rank soaks run in the default suite
def test_kill_resume_multiturn_redoes_episodes_in_flight(tmp_path):
    """The multi-turn tool task (configs/multiturn.yaml, the lookup environment with a tool latency
    so episodes are in flight at every kill): kills in steady state, at checkpoints and during
    recovery; episodes in flight are redone whole, finished ones saved with a checkpoint are reused
    under the bound, and every prompt is trained exactly once."""
    out, result = soak(tmp_path, "--kills", "3", "--seed", "2", "--phases",
                       "steady,checkpoint,recovery", "--hang-timeout", "60", "--timeout", "120",
                       "run.total_steps=24", "run.checkpoint_every=4", "eval.every_steps=0",
                       "task.env_args={latency_s: 0.1, latency_sigma: 1.0}",   # episodes outlast a step
                       config="configs/multiturn.yaml")
    assert_episodes_redone(out, result, tmp_path / "run")


@pytest.mark.slow            # a soak (60 s); test_rank_failures resumes a 2-rank run in the default suite
def test_kill_resume_with_two_trainer_ranks(tmp_path):
    """Two gloo trainer ranks (FSDP2, sharded DCP checkpoints): kill -9 of the supervisor in steady
    state, at checkpoints and during recovery keeps every promise one rank keeps: steps exactly
    once, prompts exactly once, the bound on step one after resume, no process or segment left."""
    out, result = soak(tmp_path, "--kills", "3", "--seed", "3", "--phases",
                       "steady,checkpoint,recovery", "--hang-timeout", "60", "--timeout", "120",
                       "run.total_steps=24", "run.checkpoint_every=4", "eval.every_steps=0",
                       "actor.num_ranks=2", config="configs/default.yaml")
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1)
    assert result["resumes"] >= 1 and result["final_step_is_target"] and result["steps_contiguous"]
    assert result["prompts_exactly_once"] and result["bound_kept_on_resume"]
    assert result["shm_leftovers"] == []
    assert all(r["children_alive_after_5s"] == 0 for r in result["rounds"])


@pytest.mark.slow
def test_kill_resume_long_soak(tmp_path):
    out, result = soak(tmp_path, "--kills", "50", "--seed", "7", "--hang-timeout", "60",
                       "--timeout", "300", "--drain-window", "0.5",
                       "run.total_steps=500", "run.checkpoint_every=5", "actor.sim.step_time_s=0.03",
                       timeout=1800)
    assert_recovered(out, result)
    assert sum(r["killed"] for r in result["rounds"]) >= 35   # drains may exit 143 first


def test_soak_reports_a_run_that_fails_on_its_own(tmp_path):
    # every launch exits 2 (a non-finite reward): reported as failures, never a traceback. The
    # first rollout's reward is the bad one, so each launch fails before its first step line, which
    # a steady-state kill waits for: no kill can land first, however slow the machine
    out, result = soak(tmp_path, "--kills", "1", "--phases", "steady", "--hang-timeout", "30",
                       "run.total_steps=20", "inference.sim.nan_reward_after=1")
    assert out.returncode == 1 and not result["ok"]
    assert any(f.startswith("round 0 (steady): exited 2 on its own") and "non-finite reward" in f
               for f in result["failures"]), result["failures"]
    assert any(f.startswith("final resume: exited 2") for f in result["failures"])
    assert any("no resume trained a step" in f for f in result["failures"])


def test_soak_reports_its_own_errors_as_json(tmp_path):
    out, result = soak(tmp_path, "--kills", "1", "rollout.consumer_batch_size=0")
    assert out.returncode == 1 and not result["ok"]
    assert result["failures"] and result["failures"][0].startswith("soak error: ConfigError")


def test_phase_plan_is_seeded_and_covers_every_phase_per_block():
    import random
    kr = load()
    plan = kr.phase_plan(12, random.Random(3))
    assert plan == kr.phase_plan(12, random.Random(3)) and len(plan) == 12
    assert set(plan[:5]) == set(plan[5:10]) == PHASES


# ------------------------------------------------------------------------------ the checker
T, B, G, S = 3, 2, 2, 1


def make_run(d: Path, steps=(1, 2, 3), prompts=None, resumed=(), admitted=B, raw=False):
    """A hand-made run dir: config.yaml, metrics.jsonl with `steps`, batches 1..T with the prompt
    ids `prompts[k]` (default: stream order), each prompt a group of G samples."""
    from orchestrator.run.durable import write_record
    from shm.codec import Sequences, encode
    (d / "batches").mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "run": {"total_steps": T}, "task": {"num_train_prompts": 1000},
        "rollout": {"consumer_batch_size": B, "max_head_offpolicyness": S, "group_size": G}}))
    with open(d / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"kind": "tick", "time": 0.0}) + "\n")
        for k in steps:
            f.write(json.dumps({"kind": "step", "step": k, "admitted": admitted if k in resumed else B,
                                "resumed": k in resumed, "time": float(k)}) + "\n")
    prompts = prompts or {k: [B * (k - 1) + j for j in range(B)] for k in range(1, T + 1)}
    for k in range(1, T + 1):
        seqs = [{"prompt": [1, 2], "completion": [3, 4], "reward": float(i % 2), "prompt_id": pid}
                for pid in prompts[k] for i in range(G)]
        payload = encode(Sequences.build(kind=0, ident=k, version=k - 1, seqs=seqs))
        path = d / "batches" / f"step_{k:08d}.rec"
        if raw:
            path.write_bytes(bytes(payload))
        else:
            write_record(str(path), payload)
    return d


def test_checker_accepts_a_good_run(tmp_path):
    kr = load()
    c = kr.check(make_run(tmp_path / "a", resumed=(2,)), pids=[], final=True)
    assert c["ok"] and c["failures"] == [], c
    assert c["steps_contiguous"] and c["final_step_is_target"] and c["prompts_exactly_once"]
    assert c["bound_kept_on_resume"] and c["resumed_steps"] == [2]
    assert kr.check(make_run(tmp_path / "b", raw=True), final=True)["ok"]   # pre-record batch files
    assert kr.check(make_run(tmp_path / "c", steps=(1, 2)), final=False)["ok"]   # a run in progress


def test_checker_catches_a_gap_or_a_duplicate_step(tmp_path):
    kr = load()
    for name, steps in (("gap", (1, 3)), ("dup", (1, 2, 2, 3)), ("order", (2, 1, 3))):
        for final in (True, False):
            c = kr.check(make_run(tmp_path / f"{name}{final}", steps=steps), final=final)
            assert not c["ok"] and not c["steps_contiguous"], (name, c)
            assert any("step lines not 1..k" in f for f in c["failures"])
    c = kr.check(make_run(tmp_path / "short", steps=(1, 2)), final=True)
    assert not c["ok"] and not c["final_step_is_target"]


def test_checker_catches_a_prompt_trained_twice_or_never(tmp_path):
    kr = load()
    twice = {1: [0, 1], 2: [2, 3], 3: [4, 1]}
    for final in (True, False):
        c = kr.check(make_run(tmp_path / f"twice{final}", prompts=twice), final=final)
        assert not c["ok"] and not c["prompts_exactly_once"]
        assert any("more than once" in f and "[1]" in f for f in c["failures"]), c["failures"]
    c = kr.check(make_run(tmp_path / "never", prompts={1: [0, 1], 2: [2, 3], 3: [4, 7]}), final=True)
    assert not c["ok"] and any("never trained: [5]" in f for f in c["failures"]), c["failures"]


def test_checker_catches_a_damaged_or_missing_batch_and_a_broken_bound(tmp_path):
    kr = load()
    d = make_run(tmp_path / "damaged")
    path = d / "batches" / "step_00000002.rec"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    c = kr.check(d, final=True)
    assert not c["ok"] and not c["prompts_exactly_once"]
    assert any("step 2: RecordError" in f for f in c["failures"]), c["failures"]
    d = make_run(tmp_path / "missing")
    (d / "batches" / "step_00000003.rec").unlink()
    c = kr.check(d, final=True)
    assert not c["ok"] and any("step 3: no batch file" in f for f in c["failures"])
    c = kr.check(make_run(tmp_path / "bound", resumed=(2,), admitted=(S + 1) * B + 1), final=True)
    assert not c["ok"] and not c["bound_kept_on_resume"]
