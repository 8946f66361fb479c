"""`model:` the built-in tiny model's shape or an HF model directory."""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from orchestrator.config.base import MAX_TOKENS, _Section


class ModelConfig(_Section):
    @field_validator("path")
    @classmethod
    def _path_is_a_directory(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not Path(v).is_dir():
            raise ValueError("not a directory (an HF-format model directory is expected)")
        return v


    path: Optional[str] = Field(None, description="HF-format model directory; None: build the tiny model in code")
    hidden_size: int = Field(64, ge=8, le=65536, description="tiny model width (<= 65536: no longer tiny)")
    num_layers: int = Field(2, ge=1, le=1024, description="tiny model depth (<= 1024)")
    num_heads: int = Field(4, ge=1, le=1024, description="tiny model attention heads (<= 1024)")
    max_seq_len: int = Field(64, ge=8, le=MAX_TOKENS, description="tiny model context length (<= 1M)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.path is None and self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size={self.hidden_size} is not a multiple of "
                             f"model.num_heads={self.num_heads}")
        return self
