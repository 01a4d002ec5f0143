"""``LiveOrder`` (the prefix oracle's live sequences in allocation order) behaves as the
list it stands for: the same elements at the same positions after any appends and
removes, so the driver's ``rng.choice`` draws the same sequence from either."""

import random

import pytest

from kvcheck.models.prefix.live import LiveOrder


@pytest.mark.parametrize("seed", range(6))
def test_same_as_a_list_under_random_appends_and_removes(seed):
    rng = random.Random(seed)
    want, got, nxt = [], LiveOrder(), 0
    for _ in range(3000):
        if want and rng.random() < 0.45 + 0.1 * (seed % 3):
            q = rng.choice(want)
            want.remove(q)
            got.remove(q)
        else:
            want.append(nxt)
            got.append(nxt)
            nxt += 1
        assert len(got) == len(want) and bool(got) == bool(want)
        if want:
            for k in {0, len(want) - 1, rng.randrange(len(want)), -1}:
                assert got[k] == want[k]
        if rng.random() < 0.05:
            assert list(got) == want and got == want
    assert list(got) == want
    a, b = random.Random(seed), random.Random(seed)  # the driver's draws agree
    if want:
        assert [a.choice(want) for _ in range(50)] == [b.choice(got) for _ in range(50)]


def test_built_from_a_list_and_its_errors():
    got = LiveOrder([5, 3, 9])
    assert list(got) == [5, 3, 9] and got[1] == 3 and 9 in got and 4 not in got
    got.remove(3)
    assert got == [5, 9] and got[-1] == 9 and got[0:1] == [5]
    with pytest.raises(IndexError):
        got[2]
    with pytest.raises(ValueError):
        got.remove(3)
    with pytest.raises(ValueError):
        got.append(5)
    with pytest.raises(ValueError):
        LiveOrder([1, 1])


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_run_draws_the_same_operations_with_a_list_or_a_live_order(mode, monkeypatch):
    """The oracle switches ``live()`` to a ``LiveOrder`` beyond ``LIVE_LIST`` sequences:
    with the switch at 4 instead, the very same operations, outcomes and counts."""
    from kvcheck.check.model import Options
    from kvcheck.check.run import drive
    from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
    from kvcheck.models.blocks import BlockScope
    from kvcheck.models.prefix import oracle
    from kvcheck.models.prefix.model import MODEL

    def run():
        r = drive(MODEL, PrefixCachingBlockManager, BlockScope(64, 2), Options(mode=mode), 3, 1500)
        assert r.violation is None
        return [MODEL.op_to_json(op) for op in r.history], r.state.stats, type(r.state.live())

    plain = run()
    monkeypatch.setattr(oracle, "LIVE_LIST", 4)
    switched = run()
    assert plain[2] is list and switched[2] is LiveOrder
    assert plain[:2] == switched[:2]
