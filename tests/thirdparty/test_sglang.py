"""SGLang 0.5.23 (token / paged allocators, radix cache) and aphrodite-engine 0.24.1.

Both are optional engines (``bash scripts/install_thirdparty.sh sglang aphrodite``): each
group of tests skips, saying so, when its sources are not installed. The SGLang traces
live in ``docs/traces/sglang/`` (described in docs/findings.md) so that
``test_findings.py``, which needs only the default engines, does not read them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvcheck.check.trace import Trace
from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import _loader
from kvcheck.impl.thirdparty.aphrodite import APHRODITE
from kvcheck.impl.thirdparty.sglang import SGLANG
from kvcheck.targets import vacuity
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "docs" / "traces" / "sglang"

needs_sglang = pytest.mark.skipif(
    not _loader.is_installed(SGLANG) or importlib.util.find_spec("torch") is None,
    reason="SGLang 0.5.23 sources (bash scripts/install_thirdparty.sh sglang) or torch missing")
needs_aphrodite = pytest.mark.skipif(
    not _loader.is_installed(APHRODITE),
    reason="aphrodite-engine 0.24.1 sources missing (bash scripts/install_thirdparty.sh aphrodite)")

SGL = "kvcheck.impl.thirdparty.sglang:"
RADIX = "kvcheck.impl.thirdparty.sglang_radix:"


def _replay_raw():
    spec = importlib.util.spec_from_file_location("replay_raw", ROOT / "scripts" / "replay_raw.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- the allocators ---------------------------------------------------------------------
@needs_sglang
@pytest.mark.parametrize("target,blocks,bs", [
    ("sglang-token", 8, 1), ("sglang-token", 3, 1), (SGL + "make_token_sorted", 6, 1),
    ("sglang-paged", 8, 4), ("sglang-paged", 3, 2), ("sglang-paged", 4, 16),
    (SGL + "make_paged_sorted", 6, 2),
])
def test_allocators_pass(target, blocks, bs):
    r = verify(target, blocks, bs, 1500, seed=1)
    assert r.ok, r.trace and r.trace.violation
    assert r.ops == 1500  # every operation ran (the three offered are all the driver draws)


@needs_sglang
def test_token_allocator_takes_page_size_1_only(capsys):
    assert kvcheck(["verify", "sglang-token", "--block-size", "2", "--ops", "10"]) == 2
    assert "TokenToKVPoolAllocator has page size 1" in capsys.readouterr().err


@needs_sglang
def test_paged_allocator_at_page_size_1_hands_out_a_free_slot():
    """S1: ``alloc_decode`` at page size 1 counts no new page (``seq_lens % 1 == 1`` is
    never true) and returns ``last_loc + 1`` without taking it off the free list."""
    r = verify("sglang-paged", 8, 1, 200, seed=0)
    assert not r.ok
    assert r.trace.violation.name == ("append_slot: free list shrinks by one exactly when a "
                                      "block is taken")
    assert len(r.trace.ops) == 2
    # the allocator SGLang builds at page size 1 is the token one, which holds
    assert verify("sglang-token", 8, 1, 200, seed=0).ok


@needs_sglang
def test_verdict_lists_vacuous_invariants(capsys):
    assert kvcheck(["verify", "sglang-token", "--blocks", "4", "--block-size", "1",
                    "--ops", "50"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("PASS sglang-token")
    assert "VACUOUS for this target: refcount_conservation (SGLang keeps no refcounts" in out
    assert "the contracts of fork," in out
    assert kvcheck(["verify", "sglang-paged", "--blocks", "4", "--block-size", "2",
                    "--ops", "50", "--json"]) == 0
    vac = json.loads(capsys.readouterr().out)["vacuous"]
    assert "refcount_conservation" in vac and vac["fork"].startswith("not offered")
    # a target that declares nothing prints nothing of the kind
    assert kvcheck(["verify", "reference", "--ops", "20"]) == 0
    assert "VACUOUS" not in capsys.readouterr().out


def _scrambled_pages(blocks, bs):
    """A paged allocator whose prefill hands out a page's slots out of order."""
    from kvcheck.impl.thirdparty.sglang import make_paged

    t = make_paged(blocks, bs)
    real = t.alloc.alloc_extend

    def alloc_extend(*args, **kwargs):
        out = real(*args, **kwargs)
        return None if out is None else out.flip(0)
    t.alloc.alloc_extend = alloc_extend
    return t


@needs_sglang
def test_a_row_off_its_pages_is_caught():
    r = verify(_scrambled_pages, 4, 2, 500, seed=0)
    assert not r.ok and len(r.trace.ops) <= 2, r.trace.violation
    assert "[-2]" in r.trace.violation.witness  # the row's page reads as no pool block


@needs_sglang
def test_prove_lists_vacuous_invariants():
    import types

    from kvcheck.cli.commands import prove

    vac = prove._vacuous(types.SimpleNamespace(target="sglang-token", blocks=3, block_size=1))
    assert "refcount_conservation" in vac and "fork" in vac
    assert prove._vacuous(types.SimpleNamespace(target="reference", blocks=3, block_size=1)) == {}


def test_vacuous_names_are_the_spec_s():
    class Typo:
        capabilities = frozenset({"allocate"})
        vacuous = {"refcount_conservaton": "typo"}

    with pytest.raises(TargetError, match="no invariant of the spec"):
        vacuity.vacuous(Typo())

    class NotDeclared:
        capabilities = frozenset({"allocate"})

    assert vacuity.vacuous(NotDeclared()) == {}


# -- the radix cache ---------------------------------------------------------------------
@needs_sglang
@pytest.mark.parametrize("blocks,bs", [(8, 4), (8, 2), (6, 1), (3, 2)])
def test_radix_cache_passes_the_prefix_model(blocks, bs):
    r = verify("sglang-radix", blocks, bs, 1500, seed=2, model="prefix")
    assert r.ok, r.trace and r.trace.violation
    st = r.state.stats
    assert st.hit_allocations > 0 and st.evicted > 0 and st.revived > 0, st
    if blocks > 3:
        assert st.oob > 0, st


@needs_sglang
def test_requests_sharing_pages_may_outnumber_the_rows():
    """2x1: three requests on one cached page hold three of the pool's 3 rows; a fourth is
    not admitted (SGLang's scheduler admits no more requests than free rows), not a crash
    'no req_to_token row left' (a false alarm at step 885 of seed 0)."""
    r = verify("sglang-radix", 2, 1, 1500, seed=0, model="prefix")
    assert r.ok, r.trace and r.trace.violation
    from kvcheck.impl.thirdparty.sglang_radix import make
    from kvcheck.spec.contracts import Op

    t = make(2, 1)
    for seq in range(3):
        t.allocate(seq, 1, [0])
    assert not t.admits(Op("allocate", seq=3, n_tokens=1))
    t.free_seq(0)
    assert t.admits(Op("allocate", seq=3, n_tokens=1))


@needs_sglang
def test_a_large_pool_builds(monkeypatch):
    """100000x4: the row table was rows x tokens = 100001 x 400004 int32 (160 GB; 'cannot
    build target'); now at most ROW_TABLE_SLOTS entries, the rest of the rows' budget
    enforced by admits."""
    from kvcheck.impl.thirdparty import sglang_radix

    t = sglang_radix.make(100000, 4)
    assert t.pool.req_to_token.numel() <= sglang_radix.ROW_TABLE_SLOTS + 400004
    monkeypatch.setattr(sglang_radix, "ROW_TABLE_SLOTS", 1)  # two rows: one request at a time
    r = verify(sglang_radix.make, 8, 2, 800, seed=0, model="prefix")
    assert r.ok, r.trace and r.trace.violation


@needs_sglang
@pytest.mark.parametrize("bs", [4, 1])
def test_radix_cache_passes_the_block_model(bs):
    assert verify("sglang-radix", 8, bs, 1500, seed=0).ok


@needs_sglang
def test_radix_refcounts_are_the_tree_s_locks():
    from kvcheck.impl.thirdparty.sglang_radix import make

    t = make(8, 2)
    t.allocate(0, 5, [1, 2, 3, 4, 5])
    t.allocate(1, 6, [1, 2, 3, 4, 9, 9])
    assert t.block_table(1)[:2] == t.block_table(0)[:2]  # two pages shared through the tree
    refs = t.refcounts()
    assert refs[t.block_table(0)[0]] == 2 == refs[t.block_table(0)[1]]
    t.tree.dec_lock_ref(t.reqs[1].lock.node)  # a lock dropped behind the rows' back
    assert t.refcounts()[t.block_table(0)[0]] == 1  # read from lock_ref, not from the rows


def _locked_eviction(blocks, bs):
    """A radix cache whose leaf bookkeeping forgets the lock: locked leaves evictable."""
    from kvcheck.impl.thirdparty.sglang_radix import make

    t = make(blocks, bs)
    tree = t.tree
    real = tree._update_leaf_status

    def update(node):
        real(node)
        if node is not tree.root_node and not node.evicted and not any(
                not c.evicted for c in node.children.values()):
            tree.evictable_leaves.add(node)
    tree._update_leaf_status = update
    return t


def _lock_leak(blocks, bs):
    """A release that forgets ``unlock``: the lock outlives the request."""
    from kvcheck.impl.thirdparty.sglang_radix import make

    t = make(blocks, bs)
    t.tree.unlock = lambda lock: None
    return t


@needs_sglang
@pytest.mark.parametrize("model", ["prefix", "blocks"])
def test_eviction_of_a_locked_node_is_caught(model):
    r = verify(_locked_eviction, 4, 2, 3000, seed=0, model=model)
    assert not r.ok
    assert len(r.trace.ops) <= 6, r.trace.ops


@needs_sglang
def test_a_leaked_lock_is_caught():
    r = verify(_lock_leak, 4, 2, 2000, seed=0, model="prefix")
    assert not r.ok
    # the tree's lock count (the refcount here) outlives the request that held it
    assert "refcount" in r.trace.violation.name or r.trace.violation.name in (
        "refcount_conservation", "pool_partition", "evictable_keyed"), r.trace.violation


@needs_sglang
def test_evict_then_fail_is_the_engine_order():
    r = verify(RADIX + "make_evict_first", 8, 2, 2000, seed=0, model="prefix")
    assert not r.ok
    assert r.trace.violation.name == "allocate: exception_safety: cache unchanged"
    assert verify("sglang-radix", 8, 2, 2000, seed=0, model="prefix").ok


# -- the traces: kvcheck replay, raw replay, a passing reference -----------------------------
@needs_sglang
@pytest.mark.parametrize("name,reference", [
    ("sglang-paged-block-size-1.json", "sglang-token"),
    ("sglang-radix-evict-first.json", "sglang-radix"),
])
def test_traces_reproduce_raw_and_pass_elsewhere(name, reference, capsys):
    path = TRACES / name
    assert name in (ROOT / "docs" / "findings.md").read_text()
    assert kvcheck(["replay", str(path)]) == 1
    assert capsys.readouterr().out.startswith("REPRODUCED on ")
    trace = Trace.load(path)
    r = _replay_raw().replay(trace)
    first = next((i for i, d in enumerate(r["deviations"], 1) if d), None)
    assert first == trace.violation.step, r["deviations"]
    text = " ".join(r["deviations"][first - 1])
    if "exception_safety" in trace.violation.name:
        assert "failed" in text and "changed cache" in text, text
    else:
        assert "on the free list while seqs" in text, text
    assert kvcheck(["replay", str(path), "--target", reference]) == 0


# -- aphrodite ----------------------------------------------------------------------------
@needs_aphrodite
def test_aphrodite_target_is_the_v1_adapter_on_aphrodite():
    from kvcheck.impl.thirdparty import aphrodite, vllm_v1

    a = aphrodite.make(4, 2)
    assert type(a.manager).__module__.startswith("kvcheck_tp_aphrodite")
    assert a.capabilities == vllm_v1.VllmV1Target.capabilities
    if _loader.is_installed(_loader.VLLM_V1):  # same fields as the adapter it reuses
        assert set(vars(a)) == set(vars(vllm_v1.make(4, 2)))


@needs_aphrodite
@pytest.mark.parametrize("blocks,bs", [(8, 4), (4, 1), (3, 2)])
def test_aphrodite_passes(blocks, bs):
    r = verify("aphrodite", blocks, bs, 1500, seed=0)
    assert r.ok, r.trace and r.trace.violation
    r = verify("aphrodite", blocks, bs, 1500, seed=0, model="prefix")
    assert r.ok, r.trace and r.trace.violation
    assert r.state.stats.hit_allocations > 0


# -- the release range (0.5.13 .. 0.5.23; the radix cache 0.5.22 .. 0.5.23) ----------------
def _installed(version: str) -> bool:
    from kvcheck.impl.thirdparty import install

    return install.find(install.ENGINES["sglang"], version) is not None


needs_range = pytest.mark.skipif(
    not all(_installed(v) for v in ("0.4.8", "0.5.2", "0.5.3", "0.5.13", "0.5.21", "0.5.22"))
    or importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="SGLang 0.4.8, 0.5.2, 0.5.3, 0.5.13, 0.5.21, 0.5.22 (kvcheck install "
           "sglang==VERSION), torch or triton missing")


def _cli_json(*args) -> dict:
    """The CLI in a process of its own: a target that ends the process (SIGSEGV under
    Triton's interpreter) must not end the test's."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", *args, "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    return {"rc": p.returncode, **json.loads(p.stdout)}


@needs_range
@pytest.mark.parametrize("version", ["0.4.8", "0.5.13", "0.5.23"])
def test_the_token_allocator_holds_at_both_ends_of_the_range(version):
    r = verify(f"sglang-token@{version}", 8, 1, 1500, seed=1)
    assert r.ok, r.trace and r.trace.violation
    assert r.ops == 1500


OLDEST_PAGED = """
import os, sys
from kvcheck.impl.thirdparty import sglang
before = os.environ.get("TRITON_INTERPRET")
t = sglang.make_paged(4, 2, version=sys.argv[1])
assert os.environ.get("TRITON_INTERPRET") == before
kernel = t.alloc.__class__.alloc_extend.__globals__["alloc_extend_kernel"]
assert type(kernel).__name__ == "InterpretedFunction", type(kernel)
t.allocate(0, 3)
assert t.block_table(0) == [0, 1] and t.append_slot(0) == (1, 1, None)
assert t.append_slot(0) == (2, 0, None) and sorted(t.free_blocks()) == [3]
t.free_seq(0)  # 0.4.8 and 0.5.13 have no free_segments: the release's free(row)
assert sorted(t.free_blocks()) == [0, 1, 2, 3] and t.num_free() == 4
print("ok")
"""


@needs_range
@pytest.mark.parametrize("version", ["0.4.8", "0.5.13"])
def test_the_oldest_paged_allocators_run_their_own_kernels_under_the_interpreter(version):
    """Before 0.5.22 the paged allocator launches alloc_extend_kernel / alloc_decode_kernel
    (Triton) whatever the device; they are defined in mem_cache/allocator.py (0.4.8 ..
    0.5.12, the allocators' one module) or mem_cache/triton_ops/allocator.py (0.5.13): the
    adapter executes that file under TRITON_INTERPRET=1, so the kernels are the release's
    own, and restores the variable. In a process of its own: Triton must not be imported
    before (a one-line error then, tested below)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", OLDEST_PAGED, version], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


TRITON_FIRST = """
import triton.language  # imported for the GPU before the adapter
from kvcheck.impl.thirdparty import sglang
try:
    sglang.make_paged(4, 2, version="0.5.21")
except sglang._loader.ThirdPartyMissing as exc:
    print(exc)
"""


@needs_range
def test_triton_imported_first_is_a_clear_error():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", TRITON_FIRST], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "triton was already imported in this process without TRITON_INTERPRET=1" \
        in p.stdout


@needs_range
def test_34399_is_caught_on_0_5_21_and_gone_on_0_5_22():
    """sglang #34399: before 0.5.22 the decode kernel is launched on the exhausted pool's
    empty free_pages (pointer 0) before the capacity check: the process dies (SIGSEGV under
    the interpreter, an illegal address on the GPU). 0.5.22 checks first."""
    args = ["verify", "--blocks", "3", "--block-size", "4", "--ops", "1500", "--seed", "0"]
    bad = _cli_json(args[0], "sglang-paged@0.5.21", *args[1:])
    assert bad["rc"] == 1
    v = bad["violation"]
    assert v["violation"]["kind"] == "crash" and v["violation"]["name"] == "append_slot"
    assert "SIGSEGV" in v["violation"]["witness"]
    # shrunk like any violation, each replay in a process of its own: fill the pool, append
    assert [op["op"] for op in v["ops"]] == ["allocate", "append_slot"]
    assert v["minimality"].startswith("1-minimal")
    good = _cli_json(args[0], "sglang-paged@0.5.22", *args[1:])
    assert good["rc"] == 0 and good["verdict"] == "pass"
    # behind the scheduler's admission the allocator's out-of-blocks path is never reached
    admitted = _cli_json("verify", SGL + "make_paged_admitted@0.5.21", "--blocks", "3",
                         "--block-size", "4", "--ops", "300", "--seed", "0")
    assert admitted["rc"] == 0 and admitted["verdict"] == "pass"


@needs_range
def test_s1_came_with_0_5_3_s_page_count():
    """S1 (page size 1: a decode page left on the free list) arrived with 0.5.3's
    get_num_new_pages(decode=True), (seq_lens % page_size == 1).sum(), 0 at page size 1;
    0.5.2's kernel counts the new pages itself (ret_values), right at page size 1."""
    args = ["--blocks", "8", "--block-size", "1", "--ops", "300", "--seed", "0"]
    # (only its kind matters here: shrinking a crash replays each run in a process of its
    # own, 70 s at the default budget; test_34399_is_caught_on_0_5_21... shrinks one fully)
    old = _cli_json("verify", "sglang-paged@0.5.2", *args, "--shrink-budget", "20")
    assert old["violation"]["violation"]["kind"] == "crash"  # no S1; #34399 at the exhausted pool
    assert old["violation"]["minimality"].startswith("shrinking stopped at its budget")
    new = _cli_json("verify", "sglang-paged@0.5.3", *args)["violation"]["violation"]
    assert new["name"] == "append_slot: free list shrinks by one exactly when a block is taken"
    assert new["step"] == 2


@needs_range
def test_the_radix_adapter_loads_0_5_22_and_refuses_older(capsys):
    r = verify("sglang-radix@0.5.22", 8, 2, 1000, seed=2, model="prefix")
    assert r.ok, r.trace and r.trace.violation
    assert r.state.stats.hit_allocations > 0
    assert kvcheck(["verify", "sglang-radix@0.5.21", "--ops", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sglang-radix loads sglang 0.5.22 .. 0.5.23, not 0.5.21" in err[0]
