"""vLLM v0's scheduler on ``BlockSpaceManagerV1`` with prefix caching
(``vllm-v0-engine-v1``, the releases' default block manager to 0.6.2): the release's
``CachedBlockAllocator`` keys a prompt's partial last block, shares it with an identical
prompt, copies it on the next write and re-keys (promotes) a block once it fills; the
engine oracle reads a keyed block as a cache entry only once ``computed`` (what
``get_common_computed_block_ids`` lets the runner skip) and follows the copy and the
promotion (the module doc's "Prefix caching"). Legal runs pass with both paths taken; an
allocator that keeps ``computed`` on a block it evicts (vLLM #5364's fault, which v1's
evictor does not have: ``evict`` clears it) and one that marks a partial block computed are
caught. Chunked prefill with prefix caching stays refused on v1 (the module doc).
"""

from __future__ import annotations

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v0_engine_v1 as v1
from kvcheck.models.engine.model import EngineScope
from kvcheck.models.engine.oracle import HITS
from kvcheck.verify import verify


def _run(factory, seed, block_size=4):
    scope = EngineScope(8, block_size, budget=16, max_seqs=8, caching=True)
    return verify(factory, 8, block_size, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": 30})


def _at(version, fault=None):
    def factory(*a, **k):
        t = v1.make(*a, version=version, **k)
        if fault == "keep_computed":  # evict() leaves the block's computed mark (#5364's)
            ev = t.gpu.evictor
            real = ev.evict

            def evict():
                marks = {b.block_number: b.computed for b in ev.free_table.values()}
                b = real()
                b.computed = marks[b.block_number]
                return b
            ev.evict = evict
        elif fault == "partial_computed":  # the partial last block marked computed too
            m = t.manager

            def mark(seq_group, *rest):
                for seq in seq_group.get_seqs():
                    for b in m.block_tables.get(seq.seq_id, []):
                        b.computed = True
            m.mark_blocks_as_computed = mark
        return t
    return factory


@pytest.mark.parametrize("version", ["0.4.0", "0.4.2", "0.5.0.post1", "0.6.2"])
def test_legal_runs_pass_with_shared_partial_blocks_copied_and_promoted(version):
    """Seeds 0 .. 9, blocks of 2 and 4: every run passes, with cache hits, and copies on
    write of a shared partial block or promotions to an identical cached block among them
    (0.4.2: both)."""
    install.ensure(install.ENGINES[v1.ENGINE_KEY], version)
    totals: dict[str, int] = {}
    for bs in (2, 4):
        for seed in range(10):
            r = _run(lambda *a, **k: v1.make(*a, version=version, **k), seed, bs)
            assert r.verdict == "pass", (bs, seed, r.violation)
            for k in ("hits", "copied", "promoted"):
                totals[k] = totals.get(k, 0) + r.state.stats.get(k, 0)
    assert totals["hits"] > 0 and totals["copied"] + totals["promoted"] > 0, totals


def test_a_reused_block_keeping_computed_is_caught():
    """#5364's fault put into v1's evictor (a block evicted for other content keeps
    ``computed``): the block is read as a cache entry under its new key before its new
    content is written or while it is partial (or a lookup skips it: the hit rule)."""
    install.ensure(install.ENGINES[v1.ENGINE_KEY], "0.4.2")
    names = {getattr(_run(_at("0.4.2", "keep_computed"), s).violation, "name", None)
             for s in range(10)} - {None}
    assert names and names <= {"key_after_write", "no_partial_cached", "cache_content",
                               HITS}, names


def test_a_partial_block_marked_computed_is_caught():
    """A partial last block marked computed becomes a cache entry the prefix rules
    read: it is not full in its table (or not all written)."""
    install.ensure(install.ENGINES[v1.ENGINE_KEY], "0.4.2")
    r = _run(_at("0.4.2", "partial_computed"), 0)
    assert r.verdict == "fail", r
    assert r.violation.name in ("no_partial_cached", "key_after_write", "cache_content",
                                HITS), r.violation


def test_chunked_prefill_with_prefix_caching_on_v1_is_refused_in_one_line(capsys):
    """To 0.5.5 the release's model runner refuses the pair (its words); 0.6.0 .. 0.6.2
    accept it, but a chunk may hold a computed block its lookup left out and rewrite it a
    step later, which the prefix rules would read as a partial cached block (the module
    doc): one line, exit 2."""
    for version, words in (("0.4.2", "chunked prefill cannot be used with prefix caching"),
                           ("0.6.2", "not modelled")):
        install.ensure(install.ENGINES[v1.ENGINE_KEY], version)
        assert kvcheck(["verify-engine", f"vllm-v0-engine-v1-chunked@{version}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
