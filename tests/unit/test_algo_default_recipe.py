"""The default job's numbers do not change with the recipes wired in: the train sink's advantages
under the default `algo` section equal the original GRPO normalisation bit for bit, and one
default-config trainer step (decoupled PPO, token-mean, behaviour cap, entropy bonus, 2 PPO epochs)
leaves exactly the weights and stats of the original step, written out below as it was."""
import numpy as np
import pytest
import torch

from orchestrator.algo.loss import masked_mean, ppo_loss
from orchestrator.backends.microbatch import plan
from orchestrator.backends.torch_trainer import TorchTrainer, token_logprobs
from orchestrator.config import load_config
from orchestrator.loop.train_sink import TrainSink
from shm.codec import Sequences


# ---------------------------------------------------------------- the sink
def _original_advantages(groups: list[Sequences]) -> np.ndarray:
    """The train sink's advantages before the recipes: (r - mean) / (population std + 1e-6) over the
    samples with loss-masked tokens of each group; a batch of single samples is one group; a
    single sample in a mixed batch gets 0 (no filtering here)."""
    def normalise(r, live):
        out = np.zeros(len(r), np.float32)
        if live.any():
            out[live] = (r[live] - r[live].mean()) / (r[live].std() + 1e-6)
        return out

    def live_of(g):
        cum = np.concatenate(([0], np.cumsum(g.loss_mask, dtype=np.int64)))
        return (cum[g.offsets[1:]] - cum[g.offsets[:-1]]) > 0

    if all(g.n == 1 for g in groups):
        return normalise(np.concatenate([g.rewards for g in groups]).astype(np.float64),
                         np.concatenate([live_of(g) for g in groups]))
    return np.concatenate([normalise(g.rewards.astype(np.float64), live_of(g)) if g.n > 1
                           else np.zeros(1, np.float32) for g in groups])


def _group(rng, n, dead=()) -> Sequences:
    lens = rng.integers(3, 9, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    mask = np.zeros(total, np.uint8)
    for i in range(n):
        if i not in dead:
            mask[offsets[i] + 2:offsets[i + 1]] = 1
    return Sequences(kind=1, ident=0, version=0, offsets=offsets, prompt_lens=np.full(n, 2, np.int32),
                     prompt_ids=np.zeros(n, np.int64), tokens=rng.integers(3, 19, total).astype(np.int32),
                     logprobs=np.zeros(total, np.float32), versions=np.zeros(total, np.int32),
                     loss_mask=mask, rewards=rng.choice([0.0, 0.25, 0.5, 1.0], n).astype(np.float32),
                     advantages=np.zeros(n, np.float32), scalars=np.zeros(0))


@pytest.mark.parametrize("shape", ["groups", "singletons", "mixed"])
def test_default_sink_advantages_are_the_original_bit_for_bit(shape):
    cfg = load_config()
    rng = np.random.default_rng({"groups": 0, "singletons": 1, "mixed": 2}[shape])
    for _ in range(20):
        sizes = {"groups": [16, 16, 5], "singletons": [1, 1, 1, 1], "mixed": [1, 7, 1, 3]}[shape]
        groups = [_group(rng, n, dead={1} if k == 1 else ()) for k, n in enumerate(sizes)]
        sink = TrainSink(len(groups), False, cfg.algo.advantage, cfg.algo.norm_by_std)
        for g in groups:
            sink.add(g)
        batch, _ = sink.take_batch(1, 0)
        want = _original_advantages(groups)
        assert batch.advantages.dtype == np.float32
        assert np.array_equal(batch.advantages, want)


# ---------------------------------------------------------------- the trainer
def _batch(seed=0, n=6) -> Sequences:
    rng = np.random.default_rng(seed)
    lens = rng.integers(4, 12, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    mask = np.zeros(total, np.uint8)
    for i in range(n):
        mask[offsets[i] + 3:offsets[i + 1]] = 1
    return Sequences(kind=2, ident=1, version=1, offsets=offsets, prompt_lens=np.full(n, 3, np.int32),
                     prompt_ids=np.arange(n, dtype=np.int64),
                     tokens=rng.integers(3, 19, total).astype(np.int32),
                     # some behaviour logprobs far below the model's, so that the cap of 5 bites
                     logprobs=(rng.choice([-3.0, -12.0], total, p=[0.8, 0.2])
                               + 0.3 * rng.standard_normal(total)).astype(np.float32),
                     versions=np.ones(total, np.int32), loss_mask=mask,
                     rewards=rng.random(n).astype(np.float32),
                     advantages=rng.standard_normal(n).astype(np.float32), scalars=np.zeros(0))


def _original_step(tr: TorchTrainer, batch: Sequences) -> dict:
    """The torch trainer's step before the recipes (one rank), on the same trainer internals."""
    cfg = tr.cfg
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    masked = np.asarray(batch.loss_mask, dtype=bool).copy()
    masked[offsets[:-1][np.diff(offsets) > 0]] = False
    n_tok = int(masked.sum())
    parts = [tr._tensors(batch, rows) for rows in plan(np.diff(offsets), 1, cfg.micro_batch_tokens,
                                                           cfg.pack_sequences)[0]]
    weights = [float(t["mask"].sum()) / n_tok for t in parts]
    with torch.no_grad():
        tr.model.eval()
        prox = [token_logprobs(tr.model, t, tr.temperature) for t in parts]
    for group in tr.optimizer.param_groups:
        group["lr"] = tr.lr_at(batch.ident)
    tr.model.train()
    totals = {}
    for _ in range(cfg.ppo_epochs):
        tr.optimizer.zero_grad(set_to_none=True)
        sums = {}
        for m, t in enumerate(parts):
            lp, ent = token_logprobs(tr.model, t, tr.temperature, True)
            loss, stats = ppo_loss(lp, prox[m], t["behav"], t["adv"], t["mask"], cfg.eps_clip,
                                   cfg.use_decoupled_loss, cfg.behav_imp_weight_cap)
            entropy = masked_mean(ent, t["mask"].bool())
            loss = loss - cfg.entropy_coef * entropy
            (loss * weights[m]).backward()
            stats["entropy"] = float(entropy.detach())
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v * weights[m]
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), cfg.max_grad_norm)
        tr.optimizer.step()
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + v
    return {k: v / cfg.ppo_epochs for k, v in totals.items()}


def test_default_trainer_step_is_the_original_bit_for_bit():
    cfg = load_config()
    assert cfg.actor.use_decoupled_loss and cfg.actor.ppo_epochs == 2 and cfg.actor.entropy_coef > 0

    def trainer():
        return TorchTrainer(cfg.model, cfg.actor, cfg.task, seed=0, total_steps=10, algo=cfg.algo)

    new, old = trainer(), trainer()
    batch = _batch()
    got = new.train_step(batch)
    want = _original_step(old, batch)
    assert 0 < want["behav_capped_frac"] < 1 and want["clip_frac"] > 0   # the cap and clip bite
    for k in ("loss", "clip_frac", "imp_weight_mean", "behav_capped_frac", "approx_kl", "entropy",
              "ratio_mean"):
        assert got[k] == want[k], k
    for (name, a), (_, b) in zip(new.model.named_parameters(), old.model.named_parameters()):
        assert torch.equal(a, b), name
