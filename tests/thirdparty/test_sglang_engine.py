"""SGLang's scheduling policy as an engine core (``sglang-engine``, issue 34 §1): the release's
own ``Req``, ``SchedulePolicy``, ``PrefillAdder``, ``RadixCache``, paged allocator and
allocation / release functions, driven step by step by the engine model. The pinned 0.5.23
and 0.5.22 pass; a planted bug that frees a running request's page is caught; what the
adapter does not drive is refused in one line."""

from __future__ import annotations

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import sglang_engine as se
from kvcheck.impl.thirdparty.sglang_engine import SglangEngineTarget
from kvcheck.models.engine.model import EngineScope
from kvcheck.verify import verify


def _run(factory, seed=0, blocks=8, block_size=4, budget=16, requests=15):
    scope = EngineScope(blocks, block_size, budget=budget)
    return verify(factory, blocks, block_size, 2000, seed, model="engine", scope=scope,
                  do_shrink=True, extra={"requests": requests})


def test_the_pinned_release_passes_with_cache_hits_and_chunks():
    for seed, budget in ((0, 16), (1, 4)):
        r = _run("sglang-engine", seed=seed, budget=budget)
        assert r.verdict == "pass", (seed, r.violation)
        st = r.state.stats
        assert st["finished"] + st["aborted"] == st["requests"] == 15, st
        assert st["hits"] > 0 and st["kv_calls"] > 0, st


def test_0_5_22_passes():
    r = _run("sglang-engine@0.5.22", seed=2, blocks=5)
    assert r.verdict == "pass", r.violation


class EarlyFree(SglangEngineTarget):
    """A planted bug: after each step the allocator is handed back the last page of the
    first running request that holds one, while its req_to_token row still names it."""

    def step(self, gen):
        r = super().step(gen)
        for req in self._live():
            pages = self._pages(req)
            if pages:
                page = pages[-1] + 1
                bs = self.block_size
                self.alloc.free(self.torch.arange(page * bs, page * bs + bs))
                break
        return r


def _early_free(nb, bs, budget=16, max_seqs=8, policy="fcfs", caching=True, spec=0,
                max_model_len=0):
    return EarlyFree(nb, bs, budget, max_seqs, policy, caching, spec, max_model_len)


def test_a_page_freed_while_running_is_caught_with_a_short_trace():
    r = _run(_early_free, seed=0)
    assert r.verdict == "fail" and r.violation.kind == "invariant", r.violation
    assert r.ops <= 4, r.ops  # an add and a step or two


def test_what_the_adapter_does_not_drive_is_refused_in_one_line(capsys):
    for argv, word in ((["--spec-tokens", "2"], "speculative"),
                       (["--no-prefix-caching"], "ChunkCache")):
        assert kvcheck(["verify-engine", "sglang-engine", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0] and "Traceback" not in err[0], err
    assert kvcheck(["verify-engine", "sglang-engine@0.5.21"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0.5.21" in err[0], err


def test_the_pinned_install_and_the_release_objects():
    t = se.make(4, 2)
    assert t.version == "0.5.23"
    assert type(t.policy).__name__ == "SchedulePolicy"
    assert type(t.tree).__name__ == "RadixCache"
    assert t.ns["PrefillAdder"].add_one_req.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_policy.py")
    assert t.ns["Req"].__init__.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_batch.py")
