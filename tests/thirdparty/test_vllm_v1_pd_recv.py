"""vLLM v1's disaggregated prefill, decode side (``vllm-v1-pd-recv@0.33.0``, the tiers
model): the NIXL connector's scheduler half receiving a remote prefill, with the release's
own ``Scheduler`` wait (WAITING_FOR_REMOTE_KVS), promotion and abort over its
``KVCacheManager``. 0.33.0 and 0.34.0 pass with receives (some failing: recomputed
locally), local requests and aborts while receiving; the same engine freeing an
aborted request's blocks while the receive still writes them is caught once a new
request takes one and the copy lands there."""

from __future__ import annotations

import collections

import pytest

from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v1_pd_recv as recv
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.verify import verify

SCOPE = TierScope(8, 2, 1)  # 8 device blocks of 2 slots (no host pool: the peer is remote)


def _ensure(version: str) -> str:
    install.ensure(install.ENGINES["vllm-v1"], version)
    return version


class Counting(recv.PDRecvTarget):
    """The adapter, counting what the release decided."""

    seen: collections.Counter = collections.Counter()

    def free(self, seq):
        req = self.requests.get(seq)
        waiting = req is not None and req.status == recv.RequestStatus.WAITING_FOR_REMOTE_KVS
        out = super().free(seq)
        if waiting:
            kept = req.request_id in self.shell.requests
            self.seen["aborts while receiving, blocks kept" if kept
                      else "aborts while receiving, blocks freed"] += 1
        return out

    def load(self, seq, tokens):
        self.seen["receives with another in flight"] += bool(self._jobs)
        return super().load(seq, tokens)

    def complete(self, job, ok):
        seq, req, dst = self._jobs[job]
        live = self.requests.get(seq) is req
        super().complete(job, ok)
        self.seen["promoted" if live else "aborted receive reported"] += 1
        self.seen["failed receives" if not ok else "receives"] += 1
        if live:
            assert req.status == recv.RequestStatus.RUNNING
            assert req.num_computed_tokens == req.num_tokens
            self.seen["recomputed in other blocks"] += (not ok) and self.table(seq)[1] != dst


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_0_33_0_and_0_34_0_pass_with_receives_and_aborts_in_flight(version):
    Counting.seen = collections.Counter()
    _ensure(version)
    for seed in (0, 1, 2):
        r = verify(lambda n, b, h: Counting(n, b, version=version), SCOPE.num_blocks,
                   SCOPE.block_size, 400, seed, model="tiers", scope=SCOPE)
        assert r.ok, r.violation
        assert r.state.stats["load"] > 10 and r.state.stats["oob"] > 10, r.state.stats
    seen = Counting.seen
    assert seen["promoted"] > 20 and seen["aborted receive reported"] > 5, seen
    assert seen["aborts while receiving, blocks kept"] > 5, seen
    assert seen["aborts while receiving, blocks freed"] == 0, seen
    assert seen["receives with another in flight"] > 10, seen
    assert seen["failed receives"] > 10 and seen["recomputed in other blocks"] > 5, seen


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_freeing_an_aborted_receive_s_blocks_before_it_completes_is_caught(version):
    r = verify(f"vllm-v1-pd-recv-abort-frees@{_ensure(version)}", SCOPE.num_blocks,
               SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert r.violation.name == "holds_its_tokens", r.violation
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) <= 6 and ops[-1].startswith("complete("), ops
    assert any(op.startswith("load(") for op in ops), ops


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_release_s_own_calls_hold_a_receive_s_blocks(version):
    """A raw replay on the release's objects: the connector names the parked request's
    blocks in ``reqs_to_recv``; ``finish_requests`` while it waits keeps them
    (``delay_free_blocks``) until ``_update_from_kv_xfer_finished`` sees
    ``finished_recving``; a completed receive is promoted and runs its last token."""
    t = recv.make(6, 2, version=_ensure(version))
    job = t.load(0, [1, 2, 3])
    req = t.requests[0]
    assert req.status == recv.RequestStatus.WAITING_FOR_REMOTE_KVS
    assert t.pending_jobs()[job]["dst"] == ("device", t.table(0)[1]) == ("device", [0, 1])
    t.complete(job, True)
    assert req.status == recv.RequestStatus.RUNNING and req.num_computed_tokens == 3
    assert t.append(0, 4) == (1, 1)
    job = t.load(1, [5, 6, 7, 8])
    rid = t.requests[1].request_id
    t.free(1)
    assert rid in t.shell.requests and t.pins("device") == {f"delayed free {rid}": [2, 3]}
    assert sorted(t.free_blocks("device")) == [4, 5]
    t.complete(job, True)
    assert rid not in t.shell.requests and t.pins("device") == {}
    assert sorted(t.free_blocks("device")) == [2, 3, 4, 5]
    t.free(0)
    assert sorted(t.free_blocks("device")) == list(range(6))


class TailFirst(recv.PDRecvTarget):
    """A connector naming the request's blocks out of order: the peer's KV would land in
    the wrong blocks."""

    def pending_jobs(self):
        jobs = super().pending_jobs()
        for job in jobs.values():
            job["dst"] = ("device", job["dst"][1][::-1])
        return jobs


def test_a_receive_into_blocks_other_than_the_request_s_leading_ones_is_caught():
    r = verify(lambda n, b, h: TailFirst(n, b, version=_ensure("0.33.0")), SCOPE.num_blocks,
               SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert r.violation.name == "load: a remote load writes leading blocks of the request's table"
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert ops[-1].startswith("load(") and len(ops) <= 2, ops


@pytest.mark.parametrize("version", ["0.7.0", "9.9.9", "banana"])
def test_a_release_it_cannot_load_is_one_line_and_exit_2(version):
    """Outside vLLM v1's range, or not a version at all: one line naming it, exit 2."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kvcheck", "verify-tiers",
                        f"vllm-v1-pd-recv@{version}", "--ops", "5"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcheck: error: "), r.stderr
    assert version in lines[0] and "Traceback" not in r.stderr, lines


def test_a_build_after_the_first_parses_no_release_file(monkeypatch):
    """The release's ``Scheduler`` methods and its ``remove_all`` (sched/utils.py) are parsed
    and compiled once per release and process (``_loader``: a shrink builds a target hundreds
    of times); each build still gets functions of its own."""
    import ast

    first = recv.make(8, 2)
    parsed: list = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parsed.append(a[1:2]) or parse(*a, **k))
    second = recv.make(8, 2)
    assert parsed == []
    method = "_update_waiting_for_remote_kv"
    assert getattr(type(first.shell), method) is not getattr(type(second.shell), method)


def test_a_rewritten_file_is_compiled_again(tmp_path):
    """``_loader``'s compiled definitions are keyed by the file as it is: one rewritten (a
    reinstall, a test's own file) is parsed again, never served stale."""
    from kvcheck.impl.thirdparty import _loader

    path = tmp_path / "m.py"
    for value in (1, 22):
        path.write_text(f"import nothing_here\nX = {value}\n\nclass C:\n"
                        f"    def f(self):\n        return {value}\n")
        ns: dict = {}
        assert _loader.exec_definitions(path, ns, ("X", "Y")) == ["X"] and ns["X"] == value
        methods = _loader.exec_methods(path, "C", ("f",), {}, optional=("g",))
        assert list(methods) == ["f"] and methods["f"](None) == value
    with pytest.raises(ImportError, match="has no C.g"):
        _loader.exec_methods(path, "C", ("f", "g"), {})
