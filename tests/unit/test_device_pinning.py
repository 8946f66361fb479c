"""Device pinning: inference workers get disjoint devices; on GPU weights travel over CUDA IPC, so
each inference worker also sees the trainer's GPU as its last ordinal; overlap is a config error."""
import pytest

from orchestrator.runtime.resources import RunNames
from orchestrator.config import ConfigError, load_config
from orchestrator.runtime.resources import Resources
from orchestrator.runtime.supervisor import Supervisor


def specs(overrides):
    cfg = load_config(None, overrides)
    sup = Supervisor(cfg, "/tmp/unused")
    res = Resources(RunNames("t", cfg.inference.num_workers))
    return cfg, sup, [sup._spec(res, "inference", i) for i in range(cfg.inference.num_workers)], \
        sup._spec(res, "trainer", 0)


def test_cpu_run_pins_nothing():
    cfg, sup, inf, tr = specs([])
    assert not cfg.gpu_weights and inf[0].devices == () and tr.devices == ()


def test_gpu_run_gives_disjoint_devices_plus_trainer_gpu_for_ipc():
    cfg, sup, inf, tr = specs(["inference.num_workers=2", "inference.devices=['0','1']",
                               "actor.device='2'"])
    assert cfg.gpu_weights
    assert [s.devices for s in inf] == [("0", "2"), ("1", "2")]
    assert tr.devices == ("2",)
    from orchestrator.runtime.resources import weight_nbytes
    assert weight_nbytes(cfg) == 1 << 16            # the CPU buffer carries IPC handles only


def test_overlapping_devices_are_a_config_error():
    with pytest.raises(ConfigError, match="overlaps"):
        load_config(None, ["inference.devices=['0']", "actor.device='0'"])


def test_colocated_trainer_shares_the_inference_gpu_once():
    """actor.colocate: one GPU for both (a single-GPU machine); the worker sees it once, and it is
    the last ordinal, where the inference worker opens the trainer's CUDA IPC buffer."""
    cfg, sup, inf, tr = specs(["inference.devices=['0']", "actor.device='0'", "actor.colocate=true"])
    assert cfg.gpu_weights
    assert [s.devices for s in inf] == [("0",)] and tr.devices == ("0",)
