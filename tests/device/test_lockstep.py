"""Compiled and interpreted checks (``Options.compiled``) report the same violation at the
same step on randomly faulty device stores: a corrupted K/V slot, a skipped copy-on-write
copy, a broken refcount, each at a seeded random call."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import DEVICE, SHAPE

from kvcheck.check.model import Options
from kvcheck.impl.device import DeviceBlockManager
from kvcheck.models.device import MODEL, DeviceScope

FAULTS = ("corrupt a K/V slot", "skip a copy-on-write copy", "break a refcount")


class FaultyStore(DeviceBlockManager):
    """The device manager with one fault (``kind``) at call number ``at`` or, for a
    skipped copy, at the first step with a copy from then on."""

    def __init__(self, num_blocks, block_size, kind=0, at=10, seed=0, **kw):
        super().__init__(num_blocks, block_size, **kw)
        self._kind, self._at, self._calls, self._done = kind, at, 0, False
        self._rng = random.Random(seed)

    def _tick(self) -> bool:
        self._calls += 1
        return not self._done and self._calls >= self._at

    def _fault(self) -> None:
        live = sorted(q for q in self.tables if self.lens[q])
        if not live:
            return
        q = self._rng.choice(live)
        pos = self._rng.randrange(self.lens[q])
        b = self.tables[q][pos // self.block_size]
        if self._kind == 0:  # one bit of a token a live sequence holds
            self.store.key.view(torch.int16)[0, b, pos % self.block_size, 0, 0] ^= 1
        elif self._kind == 2:
            self.ref[b] += self._rng.choice((1, -1)) if self.ref[b] > 1 else 1
        self._done = True

    def allocate(self, seq, n_tokens, k=None, v=None):
        super().allocate(seq, n_tokens, k, v)
        if self._kind != 1 and self._tick():
            self._fault()

    def fork(self, parent, child):
        super().fork(parent, child)
        if self._kind != 1 and self._tick():
            self._fault()

    def free_seq(self, seq):
        super().free_seq(seq)
        if self._kind != 1 and self._tick():
            self._fault()

    def run_step(self, reserved, k, v):
        due = self._tick()
        if self._kind == 1 and due and any(src is not None for _, _, src in reserved):
            self._done = True
            bs = self.block_size
            self.store.write_slots([block * bs + off for block, off, _ in reserved], k, v)
            return
        super().run_step(reserved, k, v)
        if self._kind != 1 and due:
            self._fault()


def _factory(kind, at, seed, backend="torch"):
    def make(nb, bs):
        return FaultyStore(nb, bs, kind, at, seed, dtype="float16", device=DEVICE,
                           backend=backend, **SHAPE)
    return make


def _lockstep(factory, nb, bs, ops, seed, mode):
    """The same operations under compiled and interpreted checks, step by step."""
    scope = DeviceScope(nb, bs)
    states = []
    for compiled in (True, False):
        options = Options(mode=mode, seed=seed, compiled=compiled, extra={"batch_prob": 0.4})
        states.append(MODEL.start(MODEL.build(factory, scope, options), scope, options))
    a_state, b_state = states
    assert a_state.oracle.compiled and not b_state.oracle.compiled
    driver = MODEL.driver(seed, scope, a_state.feed, Options(extra={"batch_prob": 0.4}))
    for _ in range(ops):
        op = driver.next_op(a_state)
        if not a_state.valid(op):
            assert not b_state.valid(op)
            continue
        twin = MODEL.request(op)
        a, b = a_state.step(op), b_state.step(twin)
        assert MODEL.op_to_json(op) == MODEL.op_to_json(twin)
        assert (a is None) == (b is None), (a, b)
        if a is not None:
            assert (a.step, a.kind, a.name, a.element) == (b.step, b.kind, b.name, b.element)
            return a
    a, b = a_state.sweep(), b_state.sweep()
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert (a.step, a.kind, a.name, a.element) == (b.step, b.kind, b.name, b.element)
    return a


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("seed", range(12))
def test_compiled_and_interpreted_agree_on_faulty_stores(seed, mode):
    rng = random.Random(seed)
    kind, at = seed % 3, rng.randrange(2, 60)
    nb, bs = [(6, 2), (10, 4), (16, 3)][seed % 4 % 3]
    _lockstep(_factory(kind, at, seed), nb, bs, 150, seed, mode)


def test_the_faults_are_found():
    """The differential test above is not vacuous: each kind of fault is caught, as its
    own kind of violation."""
    kinds = {}
    for seed in range(9):
        v = _lockstep(_factory(seed % 3, 5 + seed, seed), 10, 4, 200, seed, "fast")
        assert v is not None, FAULTS[seed % 3]
        kinds.setdefault(seed % 3, set()).add(v.kind)
    assert kinds[0] == {"data"} and kinds[1] == {"data"}
    assert kinds[2] <= {"invariant", "contract"}


def test_the_triton_kernels_in_lockstep():
    assert _lockstep(_factory(1, 3, 0, "triton"), 8, 2, 60, 0, "fast") is not None
