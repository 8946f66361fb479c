"""Training recipes: advantage estimators, loss aggregation, policy losses, KL penalties and
rollout corrections, as pure functions behind name -> function registries.

Modules:
- loss: AReaL's decoupled PPO objective and the standard clip (`ppo_loss`, `masked_mean`).

May import torch and numpy only; nothing of the runtime, the loop or the run directory.
"""
