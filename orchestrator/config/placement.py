"""`weights:` the weight hand-off; `placement:` where processes run (one node or Ray)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config.base import MAX_TIMEOUT_S, _Section


class WeightsConfig(_Section):
    sync_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="weight watcher: max time "
                                  "from publish to all inference acks (<= 1 day)")
    pause_during_sync: bool = Field(False, description="pause dispatch while inference reloads (engines that "
                                    "cannot take requests mid-reload)")


class PlacementConfig(_Section):
    """Where workers run (orchestrator.runtime.ray_cluster): on this machine (local, the default:
    Ray is never imported) or on a Ray cluster (ray: this process is the Ray driver; every inference
    worker is hosted by a Ray actor in a placement group, one bundle each; trainer ranks stay on this
    node)."""
    mode: Literal["local", "ray"] = Field("local", description="local: every worker on this "
                                          "machine; ray: inference workers placed on a Ray cluster")
    ray_address: str = Field("auto", min_length=1, description="the cluster ray.init connects to: "
                             "auto (the cluster `ray start` runs on this machine) or host:port")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement group strategy of the inference workers' bundles")
    inference_gpus: int = Field(0, ge=0, le=64, description="GPUs reserved per inference worker "
                                "(ray mode; Ray assigns the devices, inference.devices stays empty)")
    inference_resources: dict[str, float] = Field(
        default_factory=dict, description="extra Ray resources per inference worker's bundle, "
        "e.g. {node_b: 1} to place workers on nodes started with --resources='{\"node_b\": 4}'")
    ray_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="connecting to the "
                                 "cluster and reserving the placement group (else exit 2 naming "
                                 "what is missing)")
    weight_bucket_mb: int = Field(16, ge=1, le=4096, description="weights to an inference worker "
                                  "on another node go over a gloo pair in buckets of this many MiB, "
                                  "each CRC-32 checked")
