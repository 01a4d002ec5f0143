"""SGLang's own ``SWATokenToKVPoolAllocator`` (``sglang-swa@VERSION``, the tiers model with
the SWA pool behind ``full_to_swa_index_mapping``): sglang PR #27779 caught on 0.5.13,
gone on 0.5.14 and on 0.5.23 (the releases scripts/test.sh installs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty.sglang import MISALIGNED
from kvcheck.impl.thirdparty.sglang_swa import mapped_pages
from kvcheck.models.tiers.model import TierScope
from kvcheck.spec import tiers as T
from kvcheck.targets import vacuity
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

ROOT = Path(__file__).resolve().parents[2]
SCOPE = TierScope(4, 2, 1)
RELEASES = ("0.5.13", "0.5.14", "0.5.23")
missing = [v for v in RELEASES
           if not _loader.is_installed(install.select("sglang-swa", v))]
needs = pytest.mark.skipif(bool(missing), reason=f"SGLang {', '.join(missing)} not installed "
                           f"(kvcheck install sglang==VERSION)")


def run(version, ops, seed=0, scope=SCOPE):
    return verify(f"sglang-swa@{version}", scope.num_blocks, scope.block_size, ops, seed,
                  model="tiers", scope=scope)


def test_mapped_pages_reads_the_mapping_per_full_page():
    row = [2, 3, 4, 5]  # full pages 1 and 2, page size 2
    assert mapped_pages(row, [6, 7, 2, 3], 2) == [2, 0]
    assert mapped_pages(row, [0, 0, 2, 3], 2) == [None, 0]  # released whole
    assert mapped_pages(row, [0, 7, 2, 3], 2) == [2, 0]  # one token still names page 3
    assert mapped_pages(row, [6, 3, 2, 3], 2)[0] == MISALIGNED  # two pages for one
    assert mapped_pages(row, [7, 6, 2, 3], 2)[0] == MISALIGNED  # off its offset


PAIR = """
import json
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.verify import replay_trace, verify

scope = TierScope(4, 2, 1)
bug = verify("sglang-swa@0.5.13", 4, 2, 400, 0, model="tiers", scope=scope)
fixed = verify("sglang-swa@0.5.14", 4, 2, 300, 0, model="tiers", scope=scope)
again = replay_trace(bug.trace, "sglang-swa@0.5.14")
print(json.dumps({"verdict": bug.verdict, "violation": [bug.violation.kind, bug.violation.name],
                  "ops": [MODEL.describe(op) for op in bug.trace.ops],
                  "minimality": bug.trace.minimality, "fixed": fixed.ok,
                  "fixed_stats": dict(fixed.state.stats), "replayed": again.violation is None}))
"""


@needs
def test_pr_27779_is_caught_on_0_5_13_and_gone_on_0_5_14():
    """0.5.13's free_swa frees the SWA page the window's edge cuts while the page's other
    token still maps to it: caught in 2 operations. 0.5.14 passes, and so does 0.5.13's
    counterexample replayed on it. In a process of its own: before 0.5.22 the paged
    allocator runs its Triton kernels under the interpreter, which needs triton imported
    with TRITON_INTERPRET=1 (not by an earlier test)."""
    p = subprocess.run([sys.executable, "-c", PAIR], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    assert got["verdict"] == "fail" and got["violation"] == ["contract", T.MAPPING_KEEPS]
    assert len(got["ops"]) == 2 and got["ops"][1] == "slide(seq=0, upto=1)", got["ops"]
    assert got["minimality"].startswith("1-minimal")
    assert got["fixed"] and got["replayed"], got
    st = got["fixed_stats"]
    assert st["slide"] > 20 and st["append"] and st["free"] and st["oob"], st


@needs
@pytest.mark.parametrize("version,ops", [("0.5.23", 400)])
def test_the_torch_path_passes(version, ops):
    r = run(version, ops)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["slide"] > 20 and st["append"] and st["free"] and st["oob"], st
    line = vacuity.line(vacuity.of_result(r))  # the tiers model's operations, not fork & co.
    assert "refcount_conservation" in line and "fork" not in line
    assert "the contracts of store, load, prefetch, complete, evict, swap_out, swap_in (not offered)" in line


@needs
def test_page_size_one_is_refused():
    with pytest.raises(TargetError, match="page size > 1"):
        run("0.5.23", 10, scope=TierScope(4, 1, 1))
