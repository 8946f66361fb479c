"""Names, sizes and the objects themselves: every shared-memory object of one run.

The supervisor creates (and later unlinks) everything named here; workers attach by name. All names
start with `arl_<run_id>_` so the startup sweeper can find segments of dead runs (`RunNames`).
Typed send/receive over these rings and the doorbell are `orchestrator.wire`; the token budgets the
sizes follow are `orchestrator.data.budgets`.

Sizes come from the config, never from guesses: `ring_sizes(cfg) -> RingSizes` bounds the largest
record each ring carries (a rollout group: rollout.group_size samples, or eval.samples_per_prompt
when larger, of at most `max_prompt_tokens(cfg) + max_completion_tokens(cfg)` tokens, or of the
loaded prompt set's longest prompt; a training batch: rollout.consumer_batch_size groups of
rollout.group_size; an agent task's episodes as MAX_BRANCHES sequences each, their tokens within the
episode's budget, `envs.agent_session`; a Generate message of the longest prompt) and makes every
ring hold its largest record (the out ring OUT_RING_GROUPS of them, the request ring
REQ_RING_PROMPTS prompts), never below the fixed minimums, so small configs get exactly those.
`weight_nbytes(cfg)` is the weight buffer's size (the supervisor creates it with this; importing
torch only for torch backends; with inference.vllm.lora the adapters' layout, `lora.adapter_spec`); `shm_need(cfg, sizes, weight_nbytes)` the /dev/shm bytes the whole
run takes, by part (preflight compares it with the free space).

`create_resources(names, weight_nbytes, sizes, trainer_ranks) -> Resources` creates them all (the
version counter, the doorbell, the weight buffer, every ring) or, on any failure, frees what it
made and raises. `Resources` owns each object it holds (`own`, `disown`: close + unlink), makes the
version word, doorbell and weight buffer together (`core`), a restarted worker's fresh rings
(`inference_rings`) and words (`fresh_words`: progress and liveness), and `free_resources(res)`
closes and unlinks everything in reverse creation order, logging (not raising) what fails so the
rest is still freed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from orchestrator import messages
from orchestrator.wire import Bell
from orchestrator.data.budgets import episode_tokens, max_completion_tokens, max_prompt_tokens
from shm.segments import PAGE, segment_name, sem_name

log = logging.getLogger("orchestrator.runtime.resources")

# minimum ring capacities (what every ring had before sizes followed the config)
REQ_RING_BYTES = 1 << 20        # supervisor -> worker control + prompts
OUT_RING_BYTES = 8 << 20        # inference -> supervisor rollout groups
CTL_RING_BYTES = 1 << 20        # worker -> supervisor control
BATCH_RING_BYTES = 32 << 20     # supervisor -> trainer batches
OUT_RING_GROUPS = 4             # largest groups an out ring holds before its worker waits
REQ_RING_PROMPTS = 8            # longest prompts a request ring holds (a full ring only queues)
MAX_RECORD_BYTES = 2 << 30      # one record: the ring's length word is u32 (< 4 GiB) and the
                                # supervisor holds a batch record several times (built, saved, parked)
GPU_WEIGHT_BYTES = 1 << 16      # with CUDA IPC the CPU weight buffer carries handles only
_I64 = (1 << 63) - 1
_TOKEN = (1 << 31) - 1          # the largest token id a record holds (int32)


@dataclass(frozen=True)
class RingSizes:
    """Ring capacities of a run (bytes) and the largest record each carries. The defaults are the
    minimums (tests and tools that build Resources without a config)."""
    req: int = REQ_RING_BYTES
    out: int = OUT_RING_BYTES
    ctl: int = CTL_RING_BYTES
    batch: int = BATCH_RING_BYTES
    prompt_tokens: int = 0          # longest prompt
    completion_tokens: int = 0      # longest completion
    generate_bytes: int = 0         # largest Generate message
    group_bytes: int = 0            # largest rollout-group record
    batch_bytes: int = 0            # largest training-batch record


def ring_sizes(cfg, prompt_tokens: Optional[int] = None) -> RingSizes:
    """`prompt_tokens`: the loaded prompt set's longest prompt (default: `max_prompt_tokens(cfg)`)."""
    from orchestrator.envs.base import MAX_BRANCHES
    from shm.codec import MAX_SCALARS, record_size
    from shm.ring import Ring

    P = max_prompt_tokens(cfg) if prompt_tokens is None else int(prompt_tokens)
    N = max_completion_tokens(cfg)
    G, B = cfg.rollout.group_size, cfg.rollout.consumer_batch_size
    widest = max(G, cfg.eval.samples_per_prompt if cfg.eval.every_steps else 1)   # an eval group
    budget = episode_tokens(cfg)
    T = P + N if budget is None else max(P + N, budget)          # tokens per sample
    # an agent episode's branches are sequences of their own, their tokens within its budget
    seqs = MAX_BRANCHES if getattr(cfg.task, "agent", None) else 1
    group = record_size(widest * seqs, widest * T, MAX_SCALARS)
    batch = record_size(B * G * seqs, B * G * T, MAX_SCALARS)
    generate = len(messages.encode(messages.Generate(
        request_id=_I64, prompt_id=_I64, prompt_tokens=[_TOKEN] * P, n=widest, max_new_tokens=N,
        temperature=1.0, eval=True, row=_I64)))

    def cap(minimum: int, records: int, nbytes: int) -> int:
        need = records * Ring.record_space(nbytes)
        return max(minimum, (need + PAGE - 1) // PAGE * PAGE)

    return RingSizes(req=cap(REQ_RING_BYTES, REQ_RING_PROMPTS, generate),
                     out=cap(OUT_RING_BYTES, OUT_RING_GROUPS, group), ctl=CTL_RING_BYTES,
                     batch=cap(BATCH_RING_BYTES, 1, batch), prompt_tokens=P, completion_tokens=N,
                     generate_bytes=generate, group_bytes=group, batch_bytes=batch)


def weight_nbytes(cfg) -> int:
    """Bytes of the run's CPU weight buffer (the supervisor creates it with at least 8)."""
    if cfg.gpu_weights:
        return GPU_WEIGHT_BYTES
    if cfg.actor.backend == "sim":
        return cfg.actor.sim.weight_bytes
    if cfg.inference.backend == "vllm" and cfg.inference.vllm.lora:   # the adapters alone
        from orchestrator.backends.lora import adapter_spec
        return adapter_spec(cfg)[1].nbytes
    if cfg.model.path is None:         # the built-in model: sized from its config, no torch import
        from orchestrator.backends.tiny_size import tiny_weight_nbytes
        from orchestrator.data.tokens import VOCAB
        return tiny_weight_nbytes(cfg.model, len(VOCAB))
    from orchestrator.backends.model import weight_nbytes_for
    return weight_nbytes_for(cfg)


def shm_need(cfg, sizes: RingSizes, weight_bytes: int) -> dict[str, int]:
    """/dev/shm bytes of every object the supervisor creates for `cfg`, by part. A restarted
    inference worker's fresh rings exist while its old ones are freed: one spare set is counted."""
    from shm.ring import Ring
    from shm.weights import WeightBuffer

    workers = cfg.inference.num_workers
    if cfg.inference.on_worker_death == "restart" and cfg.inference.max_restarts:
        workers += 1
    return {"weights": WeightBuffer.shm_bytes(max(weight_bytes, 8)),
            "batch ring": Ring.shm_bytes(sizes.batch),
            "rollout rings": workers * Ring.shm_bytes(sizes.out),
            "request rings": workers * Ring.shm_bytes(sizes.req) + Ring.shm_bytes(REQ_RING_BYTES),
            "control rings": (workers + 1) * Ring.shm_bytes(sizes.ctl),
            "counters": (2 * workers + 4) * PAGE}   # version, doorbell, progress and liveness
                                                      # words per worker: a page each


@dataclass(frozen=True)
class RunNames:
    run_id: str
    num_inference: int

    def _n(self, role: str) -> str:
        return segment_name(self.run_id, role)

    @property
    def bell(self) -> str:
        return sem_name(self.version, "bell")     # swept together with the version segment

    @property
    def version(self) -> str:
        return self._n("version")

    @property
    def weights(self) -> str:
        return self._n("weights")

    # `gen` counts restarts of a worker: a restarted worker gets fresh rings
    def req(self, role: str, index: int, gen: int = 0) -> str:
        return self._n(f"req_{role}{index}g{gen}")

    def ctl(self, role: str, index: int, gen: int = 0) -> str:
        return self._n(f"ctl_{role}{index}g{gen}")

    def out(self, index: int, gen: int = 0) -> str:
        return self._n(f"out_inference{index}g{gen}")

    @property
    def batches(self) -> str:
        return self._n("batches")

    def heartbeat(self, role: str, index: int, gen: int = 0) -> str:
        """A worker's progress word: monotonic milliseconds of its last main-loop turn."""
        return self._n(f"hb_{role}{index}g{gen}")

    def liveness(self, role: str, index: int, gen: int = 0) -> str:
        """A worker's liveness word: monotonic milliseconds stamped by its own thread
        (`orchestrator.runtime.liveness`)."""
        return self._n(f"lv_{role}{index}g{gen}")


@dataclass
class Resources:
    names: RunNames
    bell: Optional[Bell] = None
    counter: object = None
    weights: object = None
    inference_req: list = field(default_factory=list)
    inference_out: list = field(default_factory=list)
    inference_ctl: list = field(default_factory=list)
    trainer_req: object = None
    trainer_ctl: object = None                    # trainer rank 0 (the one that reports)
    rank_ctl: list = field(default_factory=list)  # trainer ranks 1.. (Ready, Fatal)
    batches: object = None
    heartbeats: dict = field(default_factory=dict)   # (role, index) -> progress SharedCounter
    liveness: dict = field(default_factory=dict)     # (role, index) -> liveness SharedCounter
    owned: list = field(default_factory=list)     # everything to close + unlink, in creation order
    sizes: RingSizes = field(default_factory=RingSizes)   # ring capacities (resources.ring_sizes)

    def own(self, obj):
        self.owned.append(obj)
        return obj

    def disown(self, obj) -> None:
        self.owned.remove(obj)
        _free(obj)

    def fresh_words(self, role: str, i: int, gen: int = 0) -> None:
        """Fresh progress and liveness words for worker (role, i) of restart generation `gen`."""
        from shm.counter import SharedCounter
        for words, name in ((self.heartbeats, self.names.heartbeat), (self.liveness, self.names.liveness)):
            old = words.get((role, i))
            words[(role, i)] = self.own(SharedCounter.create(name(role, i, gen)))
            if old is not None:
                self.disown(old)

    def core(self, weight_nbytes: int) -> None:
        """The version word, the doorbell and the weight buffer, in that order: the bell's
        semaphore is named after the version word's segment, and a sweep judges it by that
        segment, so the two are made together (a Ray host makes its node's copies with this too)."""
        from shm.counter import SharedCounter
        from shm.weights import WeightBuffer
        self.counter = self.own(SharedCounter.create(self.names.version))
        self.bell = self.own(Bell.create(self.names.bell))
        self.weights = self.own(WeightBuffer.create(self.names.weights, max(weight_nbytes, 8)))

    def inference_rings(self, i: int, gen: int) -> tuple:
        from shm.ring import Ring
        n = self.names
        return (self.own(Ring.create(n.req("inference", i, gen), self.sizes.req)),
                self.own(Ring.create(n.out(i, gen), self.sizes.out)),
                self.own(Ring.create(n.ctl("inference", i, gen), self.sizes.ctl)))


def _free(obj) -> None:
    for fn in ("close", "unlink"):
        try:
            getattr(obj, fn)()
        except Exception as exc:      # keep freeing the rest
            log.warning("freeing %r: %s", obj, exc)


def create_resources(names: RunNames, weight_nbytes: int, sizes: RingSizes = RingSizes(),
                     trainer_ranks: int = 1) -> Resources:
    from shm.ring import Ring

    res = Resources(names, sizes=sizes)
    try:
        res.core(weight_nbytes)
        for i in range(names.num_inference):
            req, out, ctl = res.inference_rings(i, 0)
            res.inference_req.append(req)
            res.inference_out.append(out)
            res.inference_ctl.append(ctl)
        res.trainer_req = res.own(Ring.create(names.req("trainer", 0), REQ_RING_BYTES))
        res.trainer_ctl = res.own(Ring.create(names.ctl("trainer", 0), sizes.ctl))
        res.rank_ctl = [res.own(Ring.create(names.ctl("trainer", r), sizes.ctl))
                        for r in range(1, trainer_ranks)]
        res.batches = res.own(Ring.create(names.batches, sizes.batch))
    except BaseException:
        free_resources(res)
        raise
    return res


def free_resources(res: Resources) -> None:
    for obj in reversed(res.owned):
        _free(obj)
    res.owned.clear()
