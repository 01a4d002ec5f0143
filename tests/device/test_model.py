"""The device model as data: registered by name, its traces and schema loaded without torch,
its operations validated, its copies faithful for exploration, its store shrunk too."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import device_bugs as bugs
import pytest
from conftest import DEVICE, SHAPE

from kvcheck.check.explore import _copyable, explore
from kvcheck.check.model import Options, model_named
from kvcheck.check.run import replay
from kvcheck.check.shrink import counterexample
from kvcheck.check.trace import Trace, TraceError, schema
from kvcheck.impl.device import DeviceBlockManager
from kvcheck.models.device import MODEL, DecodeStep, DeviceScope
from kvcheck.models.device.model import DeviceExploreScope
from kvcheck.spec.contracts import Op
from kvcheck.verify import verify

ROOT = Path(__file__).resolve().parents[2]


def _store(backend="torch"):
    return partial(DeviceBlockManager, dtype="float16", device=DEVICE, backend=backend, **SHAPE)


def _bug(bug):
    return partial(bug, dtype="float16", device=DEVICE, backend="torch", **SHAPE)


def _decode_trace() -> Trace:
    ops = [Op("allocate", seq=0, n_tokens=3), Op("fork", seq=0, child=1),
           Op("allocate", seq=2, n_tokens=2), DecodeStep(seqs=[1, 2, 0])]
    f, scope = _bug(bugs.SwappedCopy), DeviceScope(8, 2)
    v = replay(MODEL, f, scope, ops, Options()).violation
    return counterexample(MODEL, "device", f, scope, ops, v, 7, Options(), do_shrink=False)


def test_registered_and_in_the_schema():
    assert model_named("device") is MODEL
    s = schema()
    assert "device" in s["properties"]["model"]["enum"]
    kinds = [alt["properties"]["op"]["const"] for alt in s["$defs"]["device_op"]["oneOf"]]
    assert kinds == ["allocate", "append_slot", "fork", "free_seq", "decode_step"]
    assert "append_slot" in MODEL.ops["decode_step"].doc  # the contract's words, from the spec


def test_a_trace_round_trips():
    t = _decode_trace()
    assert t.ops[-1].reserved[0][2] is not None  # the first sharer copied
    again = Trace.loads(t.dumps())
    assert again.to_json() == t.to_json() and again.model == "device"
    assert again.ops[-1].reserved == t.ops[-1].reserved


def test_loading_a_device_trace_needs_no_torch(tmp_path):
    path = tmp_path / "d.json"
    _decode_trace().write(path)
    code = f"""
import sys
from kvcheck.check.trace import Trace, schema
from kvcheck.report.html import render_html
from kvcheck.report.text import render
schema()
t = Trace.load({str(path)!r})
text = render(t)
assert "decode_step(seqs=[1, 2, 0])" in text and "one decode step over" in text, text
assert "decode_step" in render_html(t)
assert "torch" not in sys.modules, "torch was imported"
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr


def _with(data: dict, where: str, value) -> str:
    d = json.loads(json.dumps(data))
    node = d
    *path, last = where.split(".")
    for p in path:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value
    return json.dumps(d)


@pytest.mark.parametrize("where,value,words", [
    ("ops.3.seqs", [1, 1], "at most once"),
    ("ops.3.seqs", [], "at least one sequence"),
    ("ops.3.result.reserved", [[3, 1, 1], [4, 0]], "expected [block, offset, cow_src]"),
    ("ops.3.result.reserved", [None, None, None, None], "4 reservations for 3 sequences"),
    ("ops.3.result.reserved", [["x", 0, None]], "expected integer"),
    ("ops.3.seqs", [-1], "must be >= 0"),
    ("scope.num_layers", 0, "num_layers must be an integer from 1"),
    ("scope.colour", 3, "unknown size 'colour'"),
])
def test_a_bad_device_trace_is_one_line(where, value, words):
    data = _decode_trace().to_json()
    with pytest.raises(TraceError) as info:
        Trace.loads(_with(data, where, value))
    assert words in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_copies_are_faithful_and_exploration_finds_the_shortest():
    scope = DeviceExploreScope(4, 2, seqs=2, max_tokens=2, depth=3)
    options = Options(mode="full")

    def fresh(f):
        return lambda: MODEL.start(MODEL.build(f, scope, options), scope, options)

    root = fresh(_store())()
    assert _copyable(MODEL, root, scope, fresh(_store()))
    copy = root.clone()
    assert copy.step(Op("allocate", seq=0, n_tokens=2)) is None
    assert root.live() == [] and copy.live() == [0]  # independent, the store included
    found = explore(MODEL, _bug(bugs.WriteBeforeCopy), scope, options, budget=60)
    assert found.violation is not None and found.violation.key == ("data", "read-back")
    assert [o.kind for o in found.ops] == ["allocate", "fork", "append_slot"]


def test_the_store_shrinks_where_the_scope_fixes_it():
    f = partial(bugs.WriteBeforeCopy, dtype="float16", device=DEVICE, backend="torch")
    r = verify(f, 12, 4, ops=400, model="device",
               scope=DeviceScope(12, 4, num_layers=3, num_kv_heads=2, head_dim=5))
    assert not r.ok and r.violation.key == ("data", "read-back")
    assert r.trace.extra == {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1}
    assert "1 layer x 1 KV head x head dim 1" in MODEL.scope_words(r.trace.scope)
