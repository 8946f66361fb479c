"""`metrics:` the metrics thread and its sinks (TensorBoard, W&B)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from orchestrator.config.base import _Section


class WandbConfig(_Section):
    project: Optional[str] = Field(None, min_length=1, description="W&B project; set it to log every "
                                   "metrics line to Weights & Biases (needs `pip install wandb`)")
    entity: Optional[str] = Field(None, description="W&B entity (team or user); None: the default")
    name: Optional[str] = Field(None, description="W&B run name; None: W&B picks one")
    group: Optional[str] = Field(None, description="W&B group")
    mode: Literal["offline", "online"] = Field("offline", description="offline: written under "
                                               "RUN_DIR/wandb/ for `wandb sync` (no network); "
                                               "online: streamed to the W&B server")


class MetricsConfig(_Section):
    interval_s: float = Field(1.0, gt=0, le=3600.0, description="metrics thread tick interval (<= 1 h)")
    tensorboard: bool = Field(False, description="also write TensorBoard event files under "
                              "RUN_DIR/tensorboard/ (needs `pip install tensorboard`)")
    wandb: WandbConfig = Field(default_factory=WandbConfig)
