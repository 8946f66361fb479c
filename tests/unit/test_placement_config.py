"""`placement` (issue #27): local by default, where Ray is never imported; ray-mode keys refused
outside ray mode and inference.devices refused inside it (Ray assigns them), each in one line naming
the key; the framing of records between the supervisor and a Ray host numbers and checks them, so
a lost, repeated or damaged record raises instead of arriving; a bridged host's objects on its node
outlive the sweep of a second host starting there."""
import subprocess
import sys

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.runtime.ray_host import ChannelError, Frames


def _refused(*overrides) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(None, list(overrides))
    return str(exc.value)


def test_local_is_the_default_and_ray_mode_reads_its_keys():
    assert load_config(None, []).placement.mode == "local"
    place = load_config(None, ["placement.mode=ray", "placement.ray_address=127.0.0.1:6379",
                               "placement.inference_resources={node_b: 1}",
                               "placement.strategy=SPREAD"]).placement
    assert (place.ray_address, place.inference_resources, place.strategy) == \
        ("127.0.0.1:6379", {"node_b": 1.0}, "SPREAD")


@pytest.mark.parametrize("overrides, names", [
    (["placement.inference_gpus=1"], "placement.inference_gpus"),
    (["placement.inference_resources={node_b: 1}"], "placement.inference_resources"),
    (["placement.weight_bucket_mb=4"], "placement.weight_bucket_mb"),
    (["placement.mode=ray", "placement.weight_bucket_mb=0"], "placement.weight_bucket_mb"),
    (["placement.mode=ray", "inference.backend=torch", "actor.backend=torch",
      "inference.devices=[0]"], "inference.devices"),
    (["placement.mode=kubernetes"], "placement.mode"),
])
def test_nonsense_is_one_line_naming_the_key(overrides, names):
    msg = _refused(*overrides)
    assert names in msg and "\n" not in msg


def test_a_local_run_never_imports_ray():
    code = ("import sys; from orchestrator.config import load_config; "
            "from orchestrator.runtime import supervisor; load_config(None, []); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_frames_number_and_check_every_record():
    send, recv = Frames("to"), Frames("to")
    frames = [send.wrap(b"a" * n) for n in (0, 1, 100)]
    assert [recv.unwrap(f) for f in frames] == [b"", b"a", b"a" * 100]
    lost = Frames("to")
    with pytest.raises(ChannelError, match="record 1 arrived where 0 was due"):
        lost.unwrap(frames[1])
    again = Frames("to")
    again.unwrap(frames[0])
    with pytest.raises(ChannelError, match="lost or repeated"):
        again.unwrap(frames[0])
    seq, crc, data = send.wrap(b"payload")
    fresh = Frames("to")
    for f in frames:
        fresh.unwrap(f)
    with pytest.raises(ChannelError, match="CRC-32"):
        fresh.unwrap((seq, crc, b"pAyload"))


def test_a_bridged_host_s_objects_survive_another_host_s_sweep(tmp_path):
    """Every bridged host sweeps its node's objects of dead runs when it starts; the bell of a host
    already there (a semaphore, judged by the segment it is named after) must survive that."""
    import os
    from orchestrator.runtime.ray_host import WorkerHost
    from orchestrator.runtime.resources import RingSizes, RunNames
    from orchestrator.runtime.worker_base import WorkerSpec
    from orchestrator.wire import Bell
    from shm.segments import sweep_dead
    host = WorkerHost(True)
    spec = host._own_objects(WorkerSpec("inference", 0, RunNames("t", 1), {}, os.getpid(),
                                        str(tmp_path)), RingSizes(), 64)
    try:
        sweep_dead()                                  # what the next host's start does
        Bell.attach(spec.names.bell).close()
    finally:
        host.close()
