"""loop.lockstep: the deterministic schedule's rules (versions, reloads, the ship hold, deferred
checkpoints), how a wave is pinned to workers, and a wave's groups handed on in stream order."""
from types import SimpleNamespace

from orchestrator.config import deterministic_refusal, load_config
from orchestrator.loop.lockstep import Lockstep, Schedule, Wave, eval_key, pins, train_key


def test_versions_reloads_and_ship_hold_follow_the_lag():
    s = Schedule(lag=2, total_steps=10)
    assert [s.version_of(k) for k in range(1, 11)] == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert s.wave_due(0, 0) and s.wave_due(2, 0) and not s.wave_due(3, 0) and s.wave_due(3, 1)
    assert not s.wave_due(10, 7)                       # nothing past total_steps
    assert not s.may_sync(2, 0) and s.may_sync(3, 0)   # version 0 makes batches 1-3
    assert s.may_sync(10, 9)                           # the end: every version may be loaded
    assert not s.may_ship(2, 0) and s.may_ship(2, 1)
    assert s.may_ship(1, 0) and not s.may_ship(3, 1) and s.may_ship(3, 2)
    assert s.may_ship(9, 0) and s.may_ship(10, 0)      # no batch is generated at 8 or 9
    assert not s.checkpoint_ready(4, 5) and s.checkpoint_ready(4, 6)
    assert s.checkpoint_ready(10, 10)


def test_every_step_is_reachable_under_the_rules():
    """Drive the rules as the loop does (build when due, sync when allowed, ship when allowed):
    every batch k is built at version g(k) and trained at k - 1, so its age is min(k - 1, S)."""
    for lag in (0, 1, 2, 3):
        s, total = Schedule(lag, 12), 12
        built = trained = version = 0
        ages = []
        for _ in range(1000):
            if built < total and s.wave_due(built, version):
                built += 1
                ages.append(built - 1 - version)
            elif trained < built and s.may_ship(trained + 1, version):
                trained += 1
            elif version < trained and s.may_sync(built, version):
                version += 1
            if trained == total and version == total:
                break
        assert trained == total and version == total, lag
        assert ages == [min(k - 1, lag) for k in range(1, total + 1)]


def test_pins_spread_a_wave_and_release_each_worker_with_its_last_request():
    assert pins(5, [0, 1]) == [(0, True), (1, True), (0, True), (1, False), (0, False)]
    assert pins(2, [3]) == [(3, True), (3, False)]
    assert pins(1, [0, 1, 2]) == [(0, False)]


def test_a_wave_hands_on_its_groups_in_stream_order_once_complete():
    ls = Lockstep(SimpleNamespace(rollout=SimpleNamespace(max_head_offpolicyness=1),
                                  run=SimpleNamespace(total_steps=5)))
    ls.wave = Wave([10, 11, 12])
    g = {r: SimpleNamespace(ident=r) for r in (10, 11, 12, 99)}
    assert ls.arrive(g[12]) == [] and ls.arrive(g[10]) == []
    assert ls.arrive(g[99]) == [g[99]]                 # not of the wave: straight through
    assert ls.arrive(g[11]) == [g[10], g[11], g[12]] and ls.wave is None
    ls.wave = Wave([20, 21])
    g20 = SimpleNamespace(ident=20)
    assert ls.arrive(g20) == [] and ls.forget(21) == [g20] and ls.wave is None


def test_keys_and_refusals():
    assert train_key(3, 17) == [3, 0, 17] and eval_key(3, 4, 2) == [3, 1, 4, 2]
    assert deterministic_refusal(load_config(None, ["run.deterministic=true"])) is None
    assert deterministic_refusal(load_config(None, ["task.name=lookup"])) is None
