"""Entry point: `python -m orchestrator.launch [--config PATH] [key=value ...]`.

With no arguments it runs the embedded default job (`configs/default.yaml`). Exit codes: 0 success;
2 bad configuration or input (config, model directory, datasets, reward function: one line naming
the field, no traceback, nothing started, nothing in /dev/shm); 1 any other failure (message + log
path); 128+signal when stopped by SIGINT/SIGTERM before the target, at any moment from the first
instant (startup and resume recovery included). One launch holds run.dir at a time (run.lock). This module stays light: workers re-import it under
the spawn start method.
"""
from __future__ import annotations

if __name__ == "__main__":         # catch SIGINT/SIGTERM before anything else is imported
    from orchestrator.runtime.signals import StopSignals
    _EARLY = StopSignals().install()

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m orchestrator.launch",
                                description="Single-node asynchronous RL post-training runtime.")
    p.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. run.total_steps=20")
    return p.parse_args(argv)


def main(argv=None, stop=None) -> int:
    from orchestrator.runtime.signals import StopSignals
    stop = stop or StopSignals().install()
    try:
        return _main(argv, stop)
    finally:
        stop.restore()


def _main(argv, stop) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from orchestrator.config import ConfigError, load_config
    from orchestrator.data.tokens import DataError
    from orchestrator.runtime.preflight import check_machine
    from orchestrator.data.workload import build_task
    from orchestrator.run.durable import disk_full, is_disk_full
    from orchestrator.run.run_dir import RunDirError, prepare_run_dir

    try:
        cfg = load_config(args.config, args.overrides)
        task = build_task(cfg)          # tokenizer, datasets, reward: bad input fails here
        check_machine(cfg, task.max_prompt_tokens)
        plan = prepare_run_dir(cfg, task.identity)
    except (ConfigError, RunDirError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"error: {disk_full(exc, cfg.run.dir)}", file=sys.stderr)
        return 1
    try:
        return _run(cfg, plan, stop, task)
    finally:
        plan.lock.release()


def _run(cfg, plan, stop, task) -> int:
    if plan.complete:
        from shm.segments import sweep_dead
        sweep_dead()            # a run killed after its last checkpoint still leaves segments
        print(f"done: checkpoint {plan.start_step} already reaches run.total_steps="
              f"{cfg.run.total_steps}; nothing to run (run dir {plan.run_dir})", file=sys.stderr)
        return 0

    from orchestrator.run.durable import disk_full, is_disk_full
    from orchestrator.errors import Interrupted, RunFailed
    from orchestrator.observe.progress import Progress
    from orchestrator.runtime.supervisor import Supervisor

    log_hint = f"{plan.run_dir}/logs"
    logging.raiseExceptions = False      # a full disk must not dump logging tracebacks on stderr
    logging.basicConfig(filename=f"{log_hint}/supervisor.log", level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("orchestrator.launch")
    for line in cfg.said:
        log.info("%s", line)
        print(f"note: {line}", file=sys.stderr)
    for w in cfg.notes + plan.warnings:
        log.warning("%s", w)
        print(f"warning: {w}", file=sys.stderr)
    progress = Progress(cfg.run.total_steps, start=plan.start_step, enabled=cfg.run.progress,
                        S=cfg.rollout.max_head_offpolicyness, run_dir=str(plan.run_dir))

    def end() -> None:          # every run that trained a step ends with its summary paragraph
        progress.close()
        if progress.first_step is not None:
            line = progress.summary()
            log.info("%s", line)
            print(line, file=sys.stderr)
    if task.filtered:
        line = (f"{task.filtered} prompts longer than task.max_prompt_tokens="
                f"{cfg.task.max_prompt_tokens} were filtered out (task.overlong_prompts=filter)")
        log.warning("%s", line)
        print(f"warning: {line}", file=sys.stderr)
    sup = Supervisor(cfg, plan.run_dir, start_step=plan.start_step, cursor_state=plan.cursor_state,
                     checkpoint=plan.checkpoint, checkpoint_state=plan.state, stop=stop,
                     on_metrics=progress.update, task=task)
    try:
        code = sup.run()
    except Interrupted as exc:
        end()
        log.warning("%s", exc)
        print(f"{exc} (run dir {plan.run_dir})", file=sys.stderr)
        return exc.exit_code
    except RunFailed as exc:
        end()
        log.error("run failed: %s", exc)
        print(f"error: {exc} (logs: {log_hint})", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        end()
        if is_disk_full(exc):
            line = str(disk_full(exc, plan.run_dir))
            log.error("run failed: %s", line)
            print(f"error: {line}", file=sys.stderr)
            return 1
        log.exception("run failed")
        print(f"error: {type(exc).__name__}: {exc} (logs: {log_hint})", file=sys.stderr)
        return 1
    except Exception as exc:
        end()
        log.exception("run failed")
        print(f"error: {type(exc).__name__}: {exc} (logs: {log_hint})", file=sys.stderr)
        return 1
    end()
    if code == 0:
        print(f"done: {cfg.run.total_steps} steps, run dir {plan.run_dir}", file=sys.stderr)
    else:
        print(f"stopped by signal before the step target (run dir {plan.run_dir})", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(stop=_EARLY))
