"""Sliding-window tables on the real engines (issue 15 section 4).

vLLM 0.33.0's ``KVCacheManager`` with one ``SlidingWindowSpec`` group
(``vllm_v1_sliding``) and vLLM 0.8.5's ``BlockTable`` with
``max_block_sliding_window`` (``vllm_v0_sliding``). Both engines drop the blocks
behind the window themselves, at the start of each step's allocation; the
adapters issue that drop as the spec's ``drop_behind_window`` (the engine's own
call) and admit an append only once it is done. These tests fail if the split
is wrong (an append that drops inside is caught, so the admission matters),
if the drops are not issued or release nothing, if the observation of the null
block is wrong, or if the findings in docs/findings.md (F7-F9, traces under
``docs/traces/window/``) stop reproducing on kvcheck, on the raw engine API and
not on ``reference-window``. (``conftest.py`` installs the engines if missing.)
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import pytest

from kvcheck.check import run
from kvcheck.check.model import Options
from kvcheck.check.trace import Trace
from kvcheck.cli import main as kvcheck
from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import vllm_v0, vllm_v0_sliding, vllm_v1, vllm_v1_sliding
from kvcheck.models.blocks.model import MODEL, BlockScope
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import Op
from kvcheck.spec.state import NULL

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "docs" / "traces" / "window").glob("*.json"))


class Counting:
    """Wraps a target's drops and frees to count what they did on the engine; a factory
    building ``cls(num_blocks, block_size, *args(block_size))``."""

    def __init__(self, cls, args):
        self.stats = collections.Counter()
        stats = self.stats

        class Counted(cls):
            def drop_behind_window(self, seq, window):
                before = self.num_free()
                super().drop_behind_window(seq, window)
                stats["drop released" if self.num_free() > before else "drop kept all"] += 1

            def free_seq(self, seq):
                if NULL in self.block_table(seq):
                    stats["free with null entries"] += 1
                super().free_seq(seq)

        self.cls, self.args = Counted, args

    def __call__(self, num_blocks, block_size):
        return self.cls(num_blocks, block_size, *self.args(block_size))


def drive(factory, blocks, bs, seed, ops, mode="fast"):
    d = run.drive(MODEL, factory, BlockScope(blocks, bs), Options(mode=mode), seed, ops)
    return d, collections.Counter((o.kind, o.outcome) for o in d.history)


# -- vLLM v1 -----------------------------------------------------------------------
def test_v1_capabilities_and_window():
    t = vllm_v1_sliding.make(4, 2)
    assert t.capabilities == vllm_v1.VllmV1Target.capabilities | {"drop_behind_window"}
    assert (t.sliding_window, t.drop_window) == (3, 2)  # W tokens attended, W - 1 kept
    assert type(t.swa).__name__ == "SlidingWindowManager"
    assert vllm_v1_sliding.make_wide(4, 2).drop_window == 4
    with pytest.raises(MisuseError):
        vllm_v1_sliding.make_window(4, 2, 1)


@pytest.mark.parametrize("wide", [False, True], ids=["W=B+1", "W=2B+1"])
@pytest.mark.parametrize("blocks,bs,seed,mode", [(8, 2, 0, "fast"), (3, 2, 1, "fast"),
                                                 (4, 1, 2, "fast"), (16, 1, 0, "fast"),
                                                 (32, 4, 1, "fast"), (4, 2, 0, "full")])
def test_v1_sliding_passes_with_drops_issued(wide, blocks, bs, seed, mode):
    f = Counting(vllm_v1_sliding.VllmV1SlidingTarget,
                 lambda b: ((2 if wide else 1) * b + 1,))
    d, c = drive(f, blocks, bs, seed, 2500, mode)
    assert d.violation is None, d.violation
    assert f.stats["drop released"] > 50, f.stats
    assert f.stats["free with null entries"] > 20, f.stats
    assert c["append_slot", "ok"] > 150 and c["append_slots", "ok"] > 20, c
    assert c["preempt", "ok"] > 10, c
    assert sum(c[k, o] for k, o in c if o == "oob") > 0 or blocks > 8, c


def test_v1_sliding_without_prefix_caching_passes():
    t = vllm_v1_sliding.make_no_cache(4, 2)
    assert t.manager.coordinator.single_type_managers[0].enable_caching is False
    d, c = drive(vllm_v1_sliding.make_no_cache, 8, 2, 1, 2500)
    assert d.violation is None, d.violation
    assert c["drop_behind_window", "ok"] > 100 and c["preempt", "ok"] > 10, c


def test_v1_null_block_reads_as_null_and_is_vllms():
    t = vllm_v1_sliding.make(6, 2)  # W = 3: the next token reads the last 2 computed
    t.allocate(0, 5)
    assert t.block_table(0) == [0, 1, 2]
    assert not t.admits(Op("append_slot", seq=0))  # allocate_slots would drop block 0 first
    assert not t.admits(Op("drop_behind_window", seq=0, n_tokens=3))  # not this engine's window
    t.drop_behind_window(0, 2)
    assert t.block_table(0) == [NULL, 1, 2]
    blocks = t.swa.req_to_blocks["0"]
    assert blocks[0] is t.pool.null_block and t.pool.null_block.block_id == 0
    assert 0 in t.free_blocks() and t.refcount(0) == 0
    assert t.admits(Op("append_slot", seq=0))
    t.append_slot(0)
    assert t.block_table(0) == [NULL, 1, 2]
    with pytest.raises(MisuseError):
        t.drop_behind_window(0, 3)


def test_v1_split_equals_the_engines_one_call():
    """drop_behind_window then append_slot leaves the engine exactly where its own
    allocate_slots (which drops first) leaves it."""
    split, whole = vllm_v1_sliding.make(8, 2), vllm_v1_sliding.make(8, 2)
    for t in (split, whole):
        t.allocate(0, 5)
        t.allocate(1, 3)
    for _ in range(6):
        split.drop_behind_window(0, split.drop_window)
        split.append_slot(0)
        whole.append_slot(0)  # the engine's own call, not admitted by the oracle: drops inside
        assert split.block_table(0) == whole.block_table(0)
        assert sorted(split.free_blocks()) == sorted(whole.free_blocks())
        assert [split.refcount(b) for b in range(8)] == [whole.refcount(b) for b in range(8)]
    assert split.block_table(0)[:3] == [NULL, NULL, NULL]


class _AppendAlways(vllm_v1_sliding.VllmV1SlidingTarget):
    def admits(self, op):  # lets the engine drop inside its append
        if op.kind in ("append_slot", "append_slots"):
            return op.seq in self.requests
        return super().admits(op)


class _DropTooMuch(vllm_v1_sliding.VllmV1SlidingTarget):
    def drop_behind_window(self, seq, window):
        req = self._live(seq)
        self.manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens + self.block_size)


class _ReadmitAlways(vllm_v1_sliding.VllmV1SlidingTarget):
    def admits(self, op):
        return op.kind == "allocate" or super().admits(op)


@pytest.mark.parametrize("cls,name", [
    (_AppendAlways, "append_slot"),  # a drop inside an append breaks append's contract
    (_DropTooMuch, "drop_behind_window: a block inside the window stays"),
    (_ReadmitAlways, "allocate: every block handed out was free"),  # null-padded prefix hit
])
def test_v1_what_the_admissions_keep_out_is_caught(cls, name):
    d, _ = drive(lambda n, b: cls(n, b, b + 1), 8, 2, 0, 3000)
    assert d.violation is not None and d.violation.name.startswith(name), d.violation


def test_v1_readmission_with_a_null_padded_hit_is_not_admitted():
    t = vllm_v1_sliding.make(8, 2)
    t.allocate(0, 8)
    for _ in range(3):
        t.drop_behind_window(0, 2)
        t.append_slot(0)
    t.preempt(0)
    op = Op("allocate", seq=0, n_tokens=11)
    computed, hit, _ = t.manager.get_computed_blocks(t.preempted[0])
    assert hit > 0 and computed.blocks[0][0].is_null
    assert not t.admits(op)
    assert t.admits(Op("allocate", seq=0, n_tokens=3))  # another length: a new request


def test_v1_new_request_with_a_null_padded_hit_is_not_admitted():
    """A new request's prompt the cache holds is served a sliding-window hit padded with
    null blocks behind the window, which the prefix model's allocate does not describe:
    not admitted (this allocation was a false alarm of ``verify-prefix``)."""
    from kvcheck.models.prefix.model import PrefixOp

    t = vllm_v1_sliding.make(3, 1)  # W = 2
    t.allocate(0, 2, token_ids=[0, 1])
    padded = PrefixOp("allocate", seq=1, n_tokens=3, tokens=(0, 1, 2))
    req = vllm_v1.Request("probe", [0, 1, 2], t._hasher)
    computed, hit, *_ = t.manager.get_computed_blocks(req)
    assert hit == 2 and computed.blocks[0][0].is_null
    assert not t.admits(padded)
    assert t.admits(PrefixOp("allocate", seq=1, n_tokens=3, tokens=(0, 5, 6)))  # no hit, no null
    assert t.admits(Op("allocate", seq=1, n_tokens=3))  # fresh tokens


class _AdmitPadded(vllm_v1_sliding.VllmV1SlidingTarget):
    def admits(self, op):
        return op.kind == "allocate" or super().admits(op)


@pytest.mark.parametrize("bs", [1, 2, 4])
def test_v1_sliding_passes_the_prefix_model_and_the_padded_hit_is_what_it_keeps_out(bs):
    from kvcheck.models.prefix import MODEL as PREFIX

    scope = BlockScope(8, bs)
    for version in (None, "0.20.2"):
        d = run.drive(PREFIX, lambda n, b, v=version: vllm_v1_sliding.make(n, b, version=v),
                      scope, Options(), 1, 3000)
        assert d.violation is None, (version, d.violation)
    # admitting the padded hit is the violation the adapter used to report
    d = run.drive(PREFIX, lambda n, b: _AdmitPadded(n, b, b + 1), scope, Options(), 1, 3000)
    assert d.violation is not None and d.violation.name == (
        "allocate: every block the cached tokens skip holds the requested prefix"), d.violation


# -- vLLM v0 -----------------------------------------------------------------------
def test_v0_capabilities_window_and_reserved_null_block():
    t = vllm_v0_sliding.make(5, 2)
    assert t.capabilities == vllm_v0.VllmV0Target.capabilities | {"drop_behind_window"}
    assert (t.max_block_sliding_window, t.drop_window) == (3, 6)  # S // B + 2 blocks
    assert t.allocator._null_block.block_id == 0  # taken at construction, outside the ids
    assert sorted(t.free_blocks()) == [0, 1, 2, 3, 4] and t.num_free() == 5
    t.allocate(0, 8)
    assert not t.admits(Op("append_slot", seq=0))  # append_token_ids would drop block 0
    t.drop_behind_window(0, 6)
    assert t.block_table(0) == [NULL, 1, 2, 3]
    assert t.admits(Op("append_slot", seq=0))
    lazy = vllm_v0_sliding.make_lazy(5, 2)
    assert lazy.allocator._null_block is None and lazy.num_free() == 5


def test_v0_guarded_fork_only_before_a_drop():
    t = vllm_v0_sliding.make_guarded(8, 2)
    t.allocate(0, 8)
    assert t.admits(Op("fork", seq=0, child=1))
    t.drop_behind_window(0, t.drop_window)
    assert not t.admits(Op("fork", seq=0, child=1))
    assert vllm_v0_sliding.make(8, 2).fork_after_drop


class _ExactGuard(vllm_v0_sliding.VllmV0SlidingTarget):
    """can_allocate without the window cap: every other rule of the guarded target."""

    def _required_blocks(self, tokens):
        return vllm_v0.VllmV0Target._required_blocks(self, tokens)


@pytest.mark.parametrize("blocks,bs,seed", [(8, 2, 0), (6, 2, 1), (4, 1, 2), (16, 1, 0),
                                            (32, 4, 1)])  # (a window of S // B + 2 blocks)
def test_v0_guarded_passes_but_for_the_window_cap(blocks, bs, seed):
    f = Counting(_ExactGuard, lambda b: (b, "engine", False, False))
    d, c = drive(f, blocks, bs, seed, 2500)
    assert d.violation is None, d.violation
    assert f.stats["drop released"] > 30 and f.stats["free with null entries"] > 10, f.stats
    assert c["append_slot", "ok"] > 100 and c["fork", "ok"] > 10, c
    assert sum(c[k, o] for k, o in c if o == "refused") > 20, c
    # the cap is the only difference: with it, the same runs leak on an admitted allocate
    d, _ = drive(vllm_v0_sliding.make_guarded, 8, 2, 0, 2500)
    assert d.violation is not None and d.violation.name == (
        "allocate: exception_safety: free list length unchanged"), d.violation


def test_v0_sliding_oracle_clone_copies_the_null_block():
    """prove's exploration deep-copies the target: the copy's null block is its own."""
    o = Oracle(vllm_v0_sliding.make_guarded(6, 2))
    o.step(Op("allocate", seq=0, n_tokens=8))
    c = o.clone()
    assert c.step(Op("drop_behind_window", seq=0, n_tokens=6)) is None
    assert c.target.block_table(0)[0] == NULL and o.target.block_table(0)[0] == 0


# -- findings ----------------------------------------------------------------------
def _raw():
    spec = importlib.util.spec_from_file_location(
        "replay_raw_window", ROOT / "scripts" / "replay_raw_window.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_findings_are_documented():
    assert len(TRACES) >= 4
    doc = (ROOT / "docs" / "findings.md").read_text()
    for path in TRACES:
        assert f"docs/traces/window/{path.name}" in doc, path.name


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_finding_reproduces_raw_and_not_on_the_reference(path, capsys):
    assert kvcheck(["replay", str(path)]) == 1
    assert capsys.readouterr().out.startswith("REPRODUCED on ")
    trace = Trace.load(path)
    devs = _raw().replay(trace)["deviations"]
    first = next((i for i, d in enumerate(devs, 1) if d), None)
    assert first == trace.violation.step, (first, devs)
    assert kvcheck(["replay", str(path), "--target", "reference-window"]) == 0
    assert capsys.readouterr().out.startswith("PASS reference-window")


def test_raw_window_script_cli(capsys):
    mod = _raw()
    assert mod.main([str(TRACES[0])]) == 0
    assert "DEVIATION:" in capsys.readouterr().out
    assert mod.main([str(ROOT / "docs" / "traces" / "vllm-v0-cow-oob.json")]) == 2


def test_v0_lazy_null_block_runs_dry_behind_the_engines_check():
    """F8's consequence: the first windowed append at a block boundary with one free
    block passes can_append_slots, then the null block takes that block and the
    append raises NoFreeBlocksError (caught as an out-of-blocks the spec forbids)."""
    o = Oracle(vllm_v0_sliding.make_lazy_guarded(2, 2))
    assert o.step(Op("allocate", seq=0, n_tokens=2)) is None
    v = o.step(Op("append_slot", seq=0))
    assert v is not None and v.name == (
        "append_slot: out-of-blocks only when a new block is needed and none is free"), v
    assert o.target.allocator._null_block.block_id == 1 and o.target.num_free() == 0
    ok = Oracle(vllm_v0_sliding.make_guarded(2, 2))  # the null block reserved: no such step
    assert ok.step(Op("allocate", seq=0, n_tokens=2)) is None
    assert ok.step(Op("append_slot", seq=0)) is None
