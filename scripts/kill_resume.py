"""Kill-and-resume soak: kill -9 the supervisor across the whole life of a run, resume, check recovery.

    python scripts/kill_resume.py --config configs/sim.yaml --kills 6 [--seed 0] [key=value ...]

Every launch is `python -m orchestrator.launch --config C run.dir=D run.resume=auto [key=value ...]
rollout.filter_zero_std=false` in its own process group. The filter is forced off (last override
wins) so that every batch holds all its groups and "every prompt trained exactly once" can be checked
exactly. Each of `--kills` rounds picks a phase (seeded by `--seed`: the rounds walk through seeded
permutations of the phases, so rounds 0-4, 5-9, ... each cover all five) and a random moment in it:
- startup: a random moment of the first `--startup-window` s after launch, or right after the n-th
  /dev/shm entry of the launch appears (n random: anywhere in shared-memory creation);
- recovery: a resumed launch (when no checkpoint exists yet the round first runs to one and kills
  there, recorded as `prep`), killed at a random moment before its first step line or 0-50 ms after
  its `resume` event;
- steady: 0..`--steady-window` s after the launch's first step line;
- checkpoint: the next checkpoint of the launch; the kill lands 0-3 ms after `step_K.partial`
  appears, right after it is renamed to `step_K` (before `latest` names it), or 0-5 ms after
  `latest` is replaced;
- drain: SIGTERM at a random moment of steady state, then kill -9 after a random fraction of
  `--drain-window` (default: run.shutdown_timeout_s); a drain that ends first must exit 0 or 143.
File-system moments are caught with inotify (ctypes, Linux; without it the directories are polled
every 0.5 ms). The rename window is microseconds when writes are not fsynced: for it the soak pins
itself to one CPU and the supervisor to the others, busy-reads the inotify queue and kills within
microseconds of the rename (`state_at_kill`: `latest` older than `newest_dir` means it hit).
Only the supervisor pid gets the kill -9; the process group is killed afterwards as clean-up, and
after a hang (no exit and no new step line within `--hang-timeout` s). Then a final uninterrupted
resume runs to the end.

Checked after every round that wrote step lines and at the end: step lines are 1..k, each once
(k = run.total_steps at the end); batches/step_K.rec of steps 1..k decode (checksummed record files,
or bare codec records), carry ident K, version K-1 and B*group_size samples, and no prompt is trained
twice; at the end the prompt ids are exactly the stream indices 0..T*B-1 (mod task.num_train_prompts),
group_size samples each; the first step after each resume admitted at most (S+1)*B. Also: every
descendant of a killed supervisor is gone within 5 s; no round exits non-zero on its own; no hang;
at least one resume trained a step; no /dev/shm entry of any launch is left at the end. Prints a
JSON summary (`ok`, `failures`, per-round records, the checks); exit 0 iff ok.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.kill_resume_launches import (  # noqa: E402
    PHASES, FORCED, DRAIN_EXIT, CKPT_POLL_S, latest_name, _step_of, ckpt_state,
    _segments_of, _tail, DirEvents, CheckpointMoment, Pinned, spin_until, _spin, check, Launch, launch, wait,
    reap, kill_group)

# ---------------------------------------------------------------------------------------- rounds
class Soak:
    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.rng = random.Random(args.seed)
        self.run_dir, self.log_dir = args.run_dir, args.log_dir
        self.overrides = list(args.overrides)
        self.pids: list[int] = []
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.first_step_est: Optional[float] = None
        self.shm_est = 10               # /dev/shm entries a launch creates (learned from kills)
        self.current: Optional[Launch] = None
        self.n = 0

    def _launch(self, label) -> Launch:
        self.n += 1
        ln = launch(self.args.config, self.run_dir, self.overrides,
                    os.path.join(self.log_dir, f"launch_{self.n:03d}_{label}.stderr"))
        self.pids.append(ln.pid)
        self.current = ln
        return ln

    def _kill(self, ln: Launch, rec: dict, where: str, sent: bool = False) -> None:
        """kill -9 the supervisor only (unless `sent` already), then the orphan check."""
        rec["killed"], rec["kill_at_s"] = True, round(ln.elapsed(), 4)
        t = time.monotonic()
        if not sent:
            try:
                os.kill(ln.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            ln.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.failures.append(f"{where}: supervisor {ln.pid} still alive 10 s after kill -9")
        if ln.steps:          # past startup: every entry of the launch exists
            self.shm_est = max(self.shm_est, len(_segments_of([ln.pid])))
        ln.poll()
        alive = reap(ln, t)
        rec["children"], rec["children_alive_after_5s"] = len(ln.children), len(alive)
        if alive:
            self.failures.append(f"{where}: {len(alive)} descendants of the killed supervisor alive "
                                 f"5 s after kill -9: {alive}")

    def _exited(self, ln: Launch, rec: dict, where: str, allowed=(0,)) -> None:
        rc = ln.proc.returncode
        rec["returncode"] = rc
        alive = reap(ln, time.monotonic())
        rec["children"], rec["children_alive_after_5s"] = len(ln.children), len(alive)
        if rc not in allowed:
            tail = _tail(ln.err_path)
            rec["stderr_tail"] = tail
            self.failures.append(f"{where}: exited {rc} on its own: {' | '.join(tail[-3:])}")
        elif rc == 0:
            rec["completed"] = True
            if where.startswith("round"):
                self.warnings.append(f"{where}: the run reached its target before the kill")
        if alive:
            self.failures.append(f"{where}: {len(alive)} descendants alive 5 s after exit: {alive}")

    def _hang(self, ln: Launch, rec: dict, where: str, what: str) -> None:
        rec["hang"], rec["killed"] = True, False
        kill_group(ln)
        rec["children_alive_after_5s"] = len(reap(ln, time.monotonic()))
        last = ln.steps[-1]["step"] if ln.steps else None
        self.failures.append(f"{where}: hang: {what} (no exit, no new step line for "
                             f"{self.args.hang_timeout:g} s; last step of this launch {last}; "
                             f"stderr: {' | '.join(_tail(ln.err_path, 3))})")

    def _outcome(self, ln: Launch, how: str, rec: dict, where: str, what: str) -> bool:
        """Handle exit/hang; True when the launch is still running (ready for the kill)."""
        if how == "exited":
            self._exited(ln, rec, where)
            return False
        if how == "hang":
            self._hang(ln, rec, where, what)
            return False
        return True

    def _finish(self, ln: Launch, rec: dict) -> None:
        ln._next_metrics = 0.0
        ln.poll()                     # step lines written just before it died
        rec["pid"], rec["first_step_s"] = ln.pid, ln.first_step_s
        nums = [s["step"] for s in ln.steps]
        rec["new_steps"] = [nums[0], nums[-1]] if nums else []
        rec["resumed_step"] = next((s["step"] for s in ln.steps if s.get("resumed")), None)
        if ln.first_step_s is not None and (ln.resume_event or self.first_step_est is None):
            self.first_step_est = ln.first_step_s
        self.current = None

    # -- phases: each returns after the launch is gone; `rec` gets what happened
    def startup(self, ln, rec, where):
        """A random moment of the first `--startup-window` s, or right after the n-th /dev/shm
        entry of this launch appears (n random: anywhere in resource creation)."""
        rec["mode"] = mode = self.rng.choice(("timed", "shm"))
        ev = DirEvents.open("/dev/shm") if mode == "shm" else None
        if ev is None:
            rec["mode"] = "timed"
            moment = self.rng.uniform(0.0, self.args.startup_window)
            rec["target_s"] = round(moment, 4)
            how = wait(ln, until=lambda: bool(ln.steps), deadline=ln.mono0 + moment,
                       hang_s=self.args.hang_timeout, poll_s=0.002)
        else:
            nth = self.rng.randint(1, self.shm_est)
            prefix, made = f"arl_{ln.pid}-", []
            rec["nth_entry"] = nth

            def created():
                made.extend(n for m, n in ev.take() if n.removeprefix("sem.").startswith(prefix))
                return len(made) >= nth or bool(ln.steps)

            try:
                how = wait(ln, until=created, hang_s=self.args.hang_timeout, poll_s=0.02,
                           sleep=ev.sleep)
            finally:
                ev.close()
            if made:
                rec["entry"] = made[min(nth, len(made)) - 1]
            _spin(self.rng.uniform(0.0, 0.001))
        rec["late"] = how == "event" and bool(ln.steps)    # a step line came first: killed at once
        if self._outcome(ln, how, rec, where, "startup"):
            self._kill(ln, rec, where)

    def recovery(self, ln, rec, where):
        rec["mode"] = mode = self.rng.choice(("early", "after_resume_event"))
        hang = self.args.hang_timeout
        if mode == "early":
            moment = self.rng.uniform(0.0, self.first_step_est or 1.0)
            rec["target_s"] = round(moment, 4)
            how = wait(ln, until=lambda: bool(ln.steps), deadline=ln.mono0 + moment, hang_s=hang,
                       poll_s=0.002, metrics_every=0.005)
        else:
            how = wait(ln, until=lambda: ln.resume_event or bool(ln.steps), hang_s=hang,
                       poll_s=0.002, metrics_every=0.003)
            if how == "event" and not ln.steps:
                delay = self.rng.uniform(0.0, 0.05)
                rec["delay_s"] = round(delay, 4)
                how = wait(ln, until=lambda: bool(ln.steps), deadline=time.monotonic() + delay,
                           hang_s=hang, poll_s=0.002, metrics_every=0.003)
        rec["late"] = how == "event" and bool(ln.steps)
        if self._outcome(ln, how, rec, where, "waiting for the resume"):
            self._kill(ln, rec, where)

    def _steady_moment(self, ln, rec, where, window) -> bool:
        how = wait(ln, until=lambda: bool(ln.steps), hang_s=self.args.hang_timeout)
        if not self._outcome(ln, how, rec, where, "waiting for the first step line"):
            return False
        delay = self.rng.uniform(0.0, window)
        rec["delay_s"] = round(delay, 4)
        how = wait(ln, deadline=time.monotonic() + delay, hang_s=self.args.hang_timeout)
        return self._outcome(ln, how, rec, where, "steady state")

    def steady(self, ln, rec, where):
        if self._steady_moment(ln, rec, where, self.args.steady_window):
            self._kill(ln, rec, where)

    def checkpoint(self, ln, rec, where):
        """The next checkpoint of this launch (checkpoint.begin -> commit): kill 0-3 ms after its
        `step_K.partial` appears, right after it is renamed to `step_K` (before `latest` names it),
        or 0-5 ms after `latest` is replaced."""
        rec["mode"] = mode = self.rng.choice(("partial", "renamed", "after_latest"))
        how = wait(ln, until=lambda: bool(ln.steps), hang_s=self.args.hang_timeout)
        if not self._outcome(ln, how, rec, where, "waiting for the first step line"):
            return
        ckdir = os.path.join(self.run_dir, "checkpoints")
        ev = DirEvents.open(ckdir)
        rec["watch"] = "inotify" if ev is not None else "poll"
        base = ckpt_state(self.run_dir)      # stale names (a resume has cleaned up by now)
        pinned = Pinned(ln.pid) if mode == "renamed" and ev is not None else None
        if pinned is not None:
            rec["spin"] = pinned.ok

        moment = CheckpointMoment(self.run_dir, mode, base)

        try:
            if pinned is not None and pinned.ok:
                how = spin_until(ln, ev, moment.renamed, self.args.hang_timeout)
                if how == "killed":
                    self._kill(ln, rec, where, sent=True)
                    how = "event"
            elif ev is not None:
                how = wait(ln, until=lambda: moment.by_event(ev), hang_s=self.args.hang_timeout, poll_s=0.02,
                           sleep=ev.sleep)
            else:
                how = wait(ln, until=moment.by_poll, hang_s=self.args.hang_timeout, poll_s=CKPT_POLL_S,
                           metrics_every=0.05)
        finally:
            if ev is not None:
                ev.close()
            if pinned is not None:
                pinned.close()
        if not self._outcome(ln, how, rec, where, "waiting for a checkpoint"):
            return
        delay = {"partial": 0.003, "renamed_before_latest": 0.0}.get(moment.seen, 0.005)
        delay = self.rng.uniform(0.0, delay)
        if not rec["killed"]:
            _spin(delay)
            if ln.proc.poll() is not None:
                self._exited(ln, rec, where)
                return
            self._kill(ln, rec, where)
        rec["seen"], rec["delay_s"] = moment.seen, round(delay, 4)
        state = ckpt_state(self.run_dir)           # what the kill left on disk
        rec["state_at_kill"] = {"partials": state["partials"], "latest": state["latest"],
                                "newest_dir": max(state["committed"], default=None)}

    def drain(self, ln, rec, where):
        if not self._steady_moment(ln, rec, where, self.args.steady_window / 2):
            return
        window = self.args.drain_window or float(self.cfg.run.shutdown_timeout_s)
        frac = self.rng.random()
        rec["sigterm_at_s"], rec["kill_fraction"] = round(ln.elapsed(), 4), round(frac, 3)
        t = time.monotonic()
        os.kill(ln.pid, signal.SIGTERM)
        how = wait(ln, deadline=t + frac * window, hang_s=max(self.args.hang_timeout, window + 5))
        if how == "exited":
            rec["drained_s"] = round(time.monotonic() - t, 3)
            self._exited(ln, rec, where, allowed=DRAIN_EXIT)
        elif how == "hang":
            self._hang(ln, rec, where, "drain")
        else:
            late = time.monotonic() - t - (self.cfg.run.shutdown_timeout_s + 2.0)
            if late > 0:               # only reachable with --drain-window > the shutdown budget
                self.failures.append(f"{where}: still running {late:.1f} s past "
                                     "run.shutdown_timeout_s + 2 s after SIGTERM")
            self._kill(ln, rec, where)

    def prep(self, i) -> dict:
        """Recovery needs a checkpoint: run until the first one is named by `latest`, kill there."""
        rec = {"phase": "prep", "killed": False, "children_alive_after_5s": 0}
        where = f"round {i} (recovery prep)"
        ln = self._launch(f"r{i}_prep")
        how = wait(ln, until=lambda: latest_name(self.run_dir) is not None,
                   hang_s=self.args.hang_timeout, poll_s=0.002)
        if self._outcome(ln, how, rec, where, "waiting for a first checkpoint"):
            self._kill(ln, rec, where)
        self._finish(ln, rec)
        return rec

    def round(self, i, phase) -> dict:
        rec = {"round": i, "phase": phase, "killed": False, "children_alive_after_5s": 0}
        if phase == "recovery" and latest_name(self.run_dir) is None:
            rec["prep"] = self.prep(i)
        latest = latest_name(self.run_dir)
        rec["resumed_launch"] = latest is not None
        if _step_of(latest) >= self.cfg.run.total_steps:
            self.warnings.append(f"round {i}: the run already reached its target; "
                                 "raise run.total_steps for this many kills")
        where = f"round {i} ({phase})"
        ln = self._launch(f"r{i}_{phase}")
        getattr(self, phase)(ln, rec, where)
        self._finish(ln, rec)
        if "mode" in rec:
            where = f"round {i} ({phase}/{rec['mode']})"
        if ln.steps:        # new step lines: the run dir must be consistent so far
            c = check(self.run_dir, final=False)
            rec["check_ok"] = c["ok"]
            self.failures += [f"{where}: after the round: {f}" for f in c["failures"]]
        return rec

    def final(self) -> tuple[Launch, dict]:
        rec = {"phase": "final", "killed": False}
        ln = self._launch("final")
        how = wait(ln, deadline=ln.mono0 + self.args.timeout, hang_s=self.args.hang_timeout,
                   poll_s=0.02)
        if how == "exited":
            self._exited(ln, rec, "final resume")
        elif how == "hang":
            self._hang(ln, rec, "final resume", "final resume")
        else:
            rec["hang"] = True
            kill_group(ln)
            reap(ln, time.monotonic())
            self.failures.append(f"final resume: hang: not done within --timeout {self.args.timeout:g} s "
                                 f"(last step {ln.steps[-1]['step'] if ln.steps else None})")
        self._finish(ln, rec)
        return ln, rec


def phase_plan(n: int, rng: random.Random, phases=PHASES) -> list[str]:
    """Seeded permutations of `phases`, back to back: every window of len(phases) rounds that
    starts at a multiple of it covers them all."""
    plan: list[str] = []
    while len(plan) < n:
        block = list(phases)
        rng.shuffle(block)
        plan += block
    return plan[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sim.yaml")
    ap.add_argument("--kills", type=int, default=6, help="kill rounds before the final resume")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", default=",".join(PHASES), help="comma list of phases to draw from")
    ap.add_argument("--startup-window", type=float, default=0.6, help="startup kills land in 0..W s")
    ap.add_argument("--steady-window", type=float, default=1.0,
                    help="steady kills land 0..W s after the launch's first step line")
    ap.add_argument("--drain-window", type=float, default=None,
                    help="kill -9 a random fraction of W s after SIGTERM (default run.shutdown_timeout_s)")
    ap.add_argument("--hang-timeout", type=float, default=60.0,
                    help="a launch with no exit and no new step line for this long is a hang")
    ap.add_argument("--timeout", type=float, default=300.0, help="limit for the final resume (s)")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--log-dir", default=None, help="stderr of every launch (default: a temp dir)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    result: dict = {"ok": False, "failures": []}
    soak = None
    try:
        phases = tuple(p for p in args.phases.split(",") if p)
        unknown = [p for p in phases if p not in PHASES]
        if unknown or not phases:
            raise ValueError(f"--phases: unknown {unknown}, choose from {PHASES}")
        from orchestrator.config import load_config
        cfg = load_config(args.config, [*args.overrides, *FORCED])
        args.run_dir = os.path.abspath(args.run_dir or tempfile.mkdtemp(prefix="kill_resume_"))
        args.log_dir = os.path.abspath(args.log_dir or tempfile.mkdtemp(prefix="kill_resume_logs_"))
        os.makedirs(args.log_dir, exist_ok=True)
        soak = Soak(args, cfg)
        plan = phase_plan(args.kills, soak.rng, phases)
        result.update(run_dir=args.run_dir, log_dir=args.log_dir, seed=args.seed, plan=plan)
        rounds = result["rounds"] = []
        for i, phase in enumerate(plan):
            rounds.append(soak.round(i, phase))
        final, frec = soak.final()
        result["final"] = frec
        result["final_returncode"] = final.proc.returncode
        if final.proc.returncode != 0:
            result["final_stderr"] = _tail(final.err_path)
        launches = rounds + [r["prep"] for r in rounds if "prep" in r] + [frec]
        result["resumes"] = sum(1 for r in launches if r.get("resumed_step") is not None)
        pids = soak.pids if not frec.get("hang") else soak.pids[:-1]   # we killed that one
        c = check(args.run_dir, pids, final=True)
        soak.failures += [f"final check: {f}" for f in c.pop("failures")]
        c.pop("ok")
        result.update(c)
        if result["resumes"] == 0:
            soak.failures.append("no resume trained a step: every round died before a checkpoint "
                                 "or the run finished first; nothing about recovery was tested")
        result["warnings"] = soak.warnings
    except Exception as exc:          # a bug in the soak itself is a failure, never a traceback
        if soak is not None and soak.current is not None:
            kill_group(soak.current)
        frames = traceback.extract_tb(exc.__traceback__)
        at = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(frames[-4:]))
        result["failures"].append(f"soak error: {type(exc).__name__}: {exc} (at {at})")
    finally:
        if soak is not None:
            if soak.current is not None:
                kill_group(soak.current)
            for name in _segments_of(soak.pids):      # reported above; leave /dev/shm clean
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass
    if soak is not None:
        result["failures"] = soak.failures + result["failures"]
    result["ok"] = not result["failures"]
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
