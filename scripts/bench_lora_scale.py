"""How far one optimizer step moves the policy with LoRA adapters against full fine-tuning at the
same learning rate, by model width (issue #39): the evidence behind `actor.lora.alpha`'s default
and `actor.lora.lr_scale`.

    python scripts/bench_lora_scale.py [--widths 64,256,1024] [--ranks 1,8,32] [--rounds 3]

For each width a tiny Llama of that hidden size (2 layers, the built-in tokenizer's vocabulary,
seeded init) takes `--steps` Adam steps (the trainer's optimizer) on one batch of a policy-gradient
surrogate (16 random sequences of 24 tokens, advantages +-1 per sequence, loss = -mean(adv x
logprob)); the figure is the mean absolute change of the batch's token logprobs after those steps.
Full fine-tuning is the baseline measured in the same round on the same batch and model; each LoRA
case (every linear layer but the head, rank r, alpha) prints its change over full fine-tuning's.
Median and min-max over `--rounds` rounds (a round: another batch and model seed).

Adam moves every trained parameter by about lr per step whatever the gradient's size, so a full
step changes each weight by ~lr, while a LoRA step changes W by (alpha / r) x dB x A with A's
entries ~1/sqrt(fan_in): the LoRA step shrinks against the full one as the model widens. The
field's rule (LoRA at ~10x full fine-tuning's rate, alpha 32; "LoRA Without Regret", Thinking
Machines 2025) is a fact about 2k-8k wide models; at width 64 alpha = 2 x rank makes a LoRA step as
large as a full one at the same rate, so 10x the rate is 10x the step and the policy breaks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.backends import lora  # noqa: E402
from orchestrator.backends.batch_tensors import token_logprobs  # noqa: E402
from orchestrator.backends.model import build_model  # noqa: E402
from orchestrator.config import LoraConfig, ModelConfig, default_lora_alpha  # noqa: E402
from orchestrator.data.tokens import VOCAB  # noqa: E402


def logprobs(model, ids):
    """The trainer's token logprobs of every token after the first (temperature 1)."""
    return token_logprobs(model, {"ids": ids, "attn": torch.ones_like(ids)}, 1.0)[:, 1:]


def policy_change(width: int, seed: int, lr: float, steps: int, rank=None, alpha=None) -> float:
    """Mean |delta logprob| of one batch after `steps` Adam steps at `lr` (LoRA of `rank` and
    `alpha` when rank is given, else full fine-tuning)."""
    cfg = ModelConfig(hidden_size=width, num_layers=2, num_heads=4, max_seq_len=32)
    model = build_model(cfg, len(VOCAB), seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(VOCAB), (16, 24), generator=gen)
    adv = torch.randint(0, 2, (16, 1), generator=gen).float() * 2 - 1
    if rank is not None:
        model = lora.wrap(model, LoraConfig(rank=rank, alpha=alpha), seed)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trained, lr=lr)
    with torch.no_grad():
        before = logprobs(model, ids)
    model.train()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        (-(adv * logprobs(model, ids)).mean()).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return float((logprobs(model, ids) - before).abs().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="64,256,1024")
    ap.add_argument("--ranks", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ranks = [int(r) for r in args.ranks.split(",")]
    print(f"LoRA step / full step at lr {args.lr:g} ({args.steps} Adam steps, mean |d logprob|; "
          f"median (min-max) over {args.rounds} rounds)")
    print(f"{'width':>6} {'full |dlp|':>11} {'rank':>5} {'alpha':>7} {'LoRA / full':>22}")
    for width in (int(w) for w in args.widths.split(",")):
        full = [policy_change(width, s, args.lr, args.steps) for s in range(args.rounds)]
        for r in ranks:
            for name, alpha in (("2r", 2.0 * r), ("32", 32.0), ("default", default_lora_alpha(width))):
                ratios = [policy_change(width, s, args.lr, args.steps, r, alpha) / full[s]
                          for s in range(args.rounds)]
                print(f"{width:>6} {statistics.median(full):>11.4f} {r:>5} {alpha:>7.1f} "
                      f"{statistics.median(ratios):>8.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
                      f"  alpha={name}", flush=True)


if __name__ == "__main__":
    main()
