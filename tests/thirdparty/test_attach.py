"""``kvcheck attach`` on vLLM 0.33.0's own ``tests/v1/core/test_prefix_caching.py`` (issue 34 §3).

The sdist is downloaded from the package index at test time (once, into kvcheck's cache,
never into this repository); without a network and without ``$KVCHECK_SDIST_DIR`` the test
fails with attach's one line. One pytest child runs three of the engine's own tests:
``test_prefill`` as the release ships it (it passes, and kvcheck checked its manager's states),
one that reaches a module this machine cannot import (reported not run, with the reason),
and ``test_evict`` with ``BlockPool.free_blocks`` patched to keep one reference (a leak):
kvcheck fails it with ``refcount_conservation``, though the engine's own assertions would
have passed the free (the leak only shows as a block that is neither free nor held).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvcheck.cli import attach

LEAK = '''
import pytest

@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    if item.name != "test_evict":
        return
    import vllm.v1.core.block_pool as bp
    real = bp.BlockPool.free_blocks

    def leaky(self, ordered_blocks, *args, **kwargs):  # the first block keeps its reference
        return real(self, list(ordered_blocks)[1:], *args, **kwargs)

    leaky.__kvcheck_real__ = real
    bp.BlockPool.free_blocks = leaky


def pytest_runtest_teardown(item):
    import vllm.v1.core.block_pool as bp
    real = getattr(bp.BlockPool.free_blocks, "__kvcheck_real__", None)
    if real is not None:
        bp.BlockPool.free_blocks = real
'''


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    folder = tmp_path_factory.mktemp("leak")
    (folder / "kvcheck_leak_plugin.py").write_text(LEAK)
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(folder))
    failure = None
    try:  # (no network and no $KVCHECK_SDIST_DIR: attach's one line fails the tests)
        return attach.run("vllm-v1==0.33.0", ["test_prefix_caching.py"],
                          ["-p", "kvcheck_leak_plugin", "-k",
                           "test_prefill and sha256 and not cbor or test_evict or "
                           "test_hisparse_admitted_async_loads_can_finish_with_nothing_running"],
                          say=lambda _m: None)
    except attach.AttachError as exc:
        failure = f"kvcheck attach: {exc}"
    finally:
        mp.undo()
    pytest.fail(failure, pytrace=False)


def test_the_engines_own_test_passes_with_its_states_checked(outcome):
    f = outcome.files["tests/v1/core/test_prefix_caching.py"]
    assert f.passed == 1 and f.engine == 0
    assert f.checks > 1 and f.judged == 2  # test_prefill's and test_evict's managers


def test_a_test_that_cannot_run_here_is_not_run_with_its_reason(outcome):
    """(It reaches vllm.transformers_utils, which needs huggingface_hub: never a pass.)"""
    f = outcome.files["tests/v1/core/test_prefix_caching.py"]
    assert f.not_run == 1
    (why, n), = f.reasons.items()
    assert "cannot be imported here" in why and "needs " in why


def test_a_leaked_reference_fails_the_engines_test_by_kvcheck(outcome):
    f = outcome.files["tests/v1/core/test_prefix_caching.py"]
    assert f.kvcheck == 1
    (test, why), = f.kvcheck_failures
    assert test == "test_evict"
    assert "refcount_conservation" in why and "KVCacheManager.free()" in why
    assert "0 table entries" in why


def test_the_report_says_each_kind_apart(outcome):
    text = attach.render(outcome, "vllm-v1==0.33.0")
    assert "1 passed, 0 failed by the engine's own assertions, 1 failed by kvcheck, 1 not run" \
        in text
    assert "FAILED by kvcheck: test_evict" in text


def test_bad_input_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "attach", "vllm-v1==0.33.0",
                        "test_no_such_file.py"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "has no test file test_no_such_file.py" in p.stderr
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "attach", "nano-vllm",
                        "test_x.py"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and \
        "attach observes vllm-v1, vllm-v0 only" in p.stderr


def test_a_release_module_that_cannot_be_imported_is_unavailable_not_stood_in(tmp_path):
    """finder.py on a made-up release: a module whose import fails (a missing dependency)
    becomes unavailable; any use of a name from it raises NotRunHere with the reason, and the
    modules importing it still load (their own code is the release's)."""
    pkg = tmp_path / "toyengine"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import kvcheck_no_such_dependency\nclass Config: pass\n")
    (pkg / "core" / "pool.py").write_text(
        "from toyengine.heavy import Config\n"
        "def blocks(n):\n    return list(range(n))\n"
        "def configured():\n    return Config()\n")
    from kvcheck.cli.attach import finder

    found = finder.ReleaseFinder(tmp_path, top="toyengine")
    sys.meta_path.insert(0, found)
    try:
        import toyengine.core.pool as pool

        assert pool.blocks(3) == [0, 1, 2]  # the release's own code runs
        with pytest.raises(finder.NotRunHere, match="toyengine.heavy cannot be imported here "
                                                    r"\(needs kvcheck_no_such_dependency"):
            pool.configured()
        with pytest.raises(finder.NotRunHere):
            isinstance(object(), pool.Config)
        assert "toyengine.heavy" in finder.UNAVAILABLE
    finally:
        sys.meta_path.remove(found)
        for name in [m for m in sys.modules if m == "toyengine" or m.startswith("toyengine.")]:
            del sys.modules[name]
