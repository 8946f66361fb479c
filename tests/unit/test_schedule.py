"""algo.schedule.lr_at: linear warm-up to actor.lr, then constant or cosine over the steps left,
as the torch trainer applies it (a pure function of the step: a resumed run continues it)."""
import pytest

from orchestrator.algo.schedule import lr_at
from orchestrator.config import load_config


def test_constant_and_cosine_without_warmup():
    assert [lr_at(s, lr=1e-3, total_steps=10) for s in (1, 5, 10)] == [1e-3] * 3
    cos = [lr_at(s, lr=1e-3, total_steps=11, schedule="cosine", min_ratio=0.1) for s in range(1, 12)]
    assert cos[0] == pytest.approx(1e-3) and cos[-1] == pytest.approx(1e-4)
    assert cos[5] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))           # halfway
    assert all(a > b for a, b in zip(cos, cos[1:]))
    assert lr_at(1, lr=1e-3, total_steps=1, schedule="cosine") == 1e-3   # one step: no schedule
    # step 0 (a trainer driven without steps, as test_torch_learns does) is step 1's lr
    assert lr_at(0, lr=1e-3, total_steps=11, schedule="cosine") == pytest.approx(1e-3)
    assert lr_at(0, lr=1e-3, total_steps=11, warmup_steps=4) == pytest.approx(1e-3 / 4)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_warmup_rises_linearly_then_the_schedule_runs_over_the_steps_left(schedule):
    kw = dict(lr=2e-3, total_steps=40, schedule=schedule, min_ratio=0.1, warmup_steps=10)
    warm = [lr_at(s, **kw) for s in range(1, 11)]
    assert warm == pytest.approx([2e-3 * s / 10 for s in range(1, 11)])
    after = [lr_at(s, **kw) for s in range(11, 41)]
    if schedule == "constant":
        assert after == pytest.approx([2e-3] * 30)
    else:   # the cosine of a 30-step run, shifted by the warm-up
        assert after == pytest.approx([lr_at(s, lr=2e-3, total_steps=30, schedule="cosine")
                                       for s in range(1, 31)])
        assert after[0] == pytest.approx(2e-3) and after[-1] == pytest.approx(2e-4)


def test_the_config_key_and_its_bounds():
    cfg = load_config(None, ["actor.lr_warmup_steps=25"])
    assert cfg.actor.lr_warmup_steps == 25
    assert type(cfg.actor).model_fields["lr_warmup_steps"].default == 0   # off unless asked
    with pytest.raises(Exception, match="lr_warmup_steps"):
        load_config(None, ["actor.lr_warmup_steps=-1"])
    with pytest.raises(ValueError, match="schedule"):
        lr_at(20, lr=1.0, total_steps=40, schedule="linear")


def test_the_torch_trainer_takes_its_lr_from_it():
    pytest.importorskip("torch")
    from orchestrator.backends.torch_trainer import TorchTrainer
    from orchestrator.config import ActorConfig, ModelConfig, TaskConfig
    actor = ActorConfig(backend="torch", lr=1e-3, lr_warmup_steps=4, lr_schedule="cosine")
    tr = TorchTrainer(ModelConfig(), actor, TaskConfig(name="copy2"), 0, total_steps=20)
    assert [tr.lr_at(s) for s in (1, 4, 5, 20)] == pytest.approx([2.5e-4, 1e-3, 1e-3, 1e-4])
