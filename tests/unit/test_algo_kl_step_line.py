"""The KL to the reference reaches the step line by the issue's name, `kl_ref_mean` (issue #24
item 4); the other KL stat stays `train_kl_ref_loss`; a run without actor.kl_ctl has neither."""
from orchestrator import messages
from orchestrator.loop.step_lines import step_fields
from orchestrator.loop.train_sink import TrainSink
from tests.unit.test_train_sink import group


def _fields(stats: dict) -> dict:
    sink = TrainSink(1, False)
    sink.add(group(0, [1, 0]))
    _, info = sink.take_batch(1, 0)
    done = messages.StepDone(step=1, version=1, publish_time=0.0, train_s=0.1, stats=stats)
    return step_fields(info, done)[0]


def test_kl_ref_mean_is_promoted():
    f = _fields({"loss": 0.5, "kl_ref_mean": 0.0, "kl_ref_loss": 0.25, "clip_frac": 0.1})
    assert f["kl_ref_mean"] == 0.0 and f["train_kl_ref_loss"] == 0.25 and f["train_clip_frac"] == 0.1
    assert "train_kl_ref_mean" not in f


def test_no_kl_fields_without_the_reference():
    f = _fields({"loss": 0.5, "clip_frac": 0.1})
    assert not [k for k in f if "kl_ref" in k]
