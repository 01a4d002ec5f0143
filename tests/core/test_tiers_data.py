"""The tiers model's data level (issue 33: the device data model): a target that holds K/V
has every block read back after every step, and a copy that moves the wrong bytes is
caught even where every refcount, table and key is right."""

from __future__ import annotations

import pytest
import torch

from kvcheck.impl.tiered_data import DataTieredCache
from kvcheck.models.tiers import data
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.spec import tiers as T
from kvcheck.verify import verify

from corpus.tiers_data import DATA_CORPUS, StructureOnly

SCOPE = TierScope(8, 2, 4)
# the seed whose run reaches each bug early (each is found at most seeds, after up to ~700
# operations, and shrinking a long run of the tiers model takes a minute or more)
SEED = {"swap-in-reversed": 3, "failed-load-not-recomputed": 5, "store-copies-next-block": 0}


def run(target, seed=0, ops=1500, scope=SCOPE):
    return verify(target, scope.num_blocks, scope.block_size, ops, seed, model="tiers",
                  scope=scope)


@pytest.mark.parametrize("seed,scope", [(0, TierScope(12, 2, 6)), (1, TierScope(6, 1, 3))])
def test_the_reference_with_its_kv_passes_and_is_read_back(seed, scope):
    r = run("reference-tiers-data", seed, scope=scope)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] and st["load"] and st["complete"] and st["swap_out"]
    # every block of both pools, after every step
    assert r.state.data is not None and r.state.data.reads == r.ops * sum(
        r.state.sizes.values())


@pytest.mark.parametrize("name", sorted(DATA_CORPUS))
def test_every_copy_bug_is_caught_at_the_data_level_only(name):
    cls = DATA_CORPUS[name]
    r = run(cls, SEED[name])
    assert r.verdict == "fail", name
    assert (r.violation.kind, r.violation.name) == ("data", T.DATA_READ_BACK), r.violation
    assert r.trace.minimality.startswith("1-minimal"), r.trace.minimality
    assert len(r.trace.ops) <= 6, [MODEL.describe(op) for op in r.trace.ops]
    # the same run without the data methods: every structural rule holds
    assert run(StructureOnly(cls), SEED[name]).ok, name


def test_the_model_kvcheck_stands_in_for_depends_on_the_whole_prefix():
    assert torch.equal(data.kv((1, 2, 3)), data.kv((1, 2, 3)))
    assert not torch.equal(data.kv((1, 2, 3)), data.kv((0, 2, 3)))  # same last token
    assert data.kv((5,)).shape == (data.KV_WIDTH,) and data.kv((5,)).dtype == torch.float32


class WrongShape(DataTieredCache):
    def pool_data(self, pool):
        return super().pool_data(pool)[:, :, :3]


class RaisesOnRead(DataTieredCache):
    pool_data = None  # (read block by block)

    def block_data(self, pool, b):
        raise RuntimeError("no such buffer")


@pytest.mark.parametrize("cls,words", [(WrongShape, "has shape"), (RaisesOnRead, "raised")])
def test_a_broken_block_data_is_reported_not_suffered(cls, words):
    r = run(cls, ops=50)
    assert r.verdict == "fail" and r.violation.kind == "malformed", r.violation
    assert words in r.violation.witness


def test_the_device_pool_lives_where_asked():
    """On the CPU in CI; ``scripts/gpu_check.sh`` runs the same reference on CUDA."""
    store = DataTieredCache(4, 2, 2, device="cpu")
    assert store.kv_data[T.DEVICE].device.type == "cpu"
    assert store.kv_data[T.HOST].device.type == "cpu"
