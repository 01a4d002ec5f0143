"""``kvcheck install`` and the version-range adapters (``vllm-v0@0.4.3``, ``vllm-v1@0.10.2``).

The ends of each adapter's range are driven by the oracle: vLLM v0 block manager v2 at
0.4.3 (the first release without PR #4761's bug, which 0.4.2 has: see
benchmarks/historical), 0.8.5 and 0.9.2 (its last end: 0.9.x still ships v0), v1 at
0.10.2 and 0.33.0. A release that is not
installed is installed by the fixture (py files only: 0.4.3 is a 131 MB download, 0.10.2
about 250 MB), or the test skips when the index cannot be reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import _loader, install, vllm_v0, vllm_v1
from kvcheck.verify import verify

OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": " ",
           "PIP_FIND_LINKS": " ", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}


def _have(key: str, version: str) -> None:
    try:
        install.ensure(install.ENGINES[key], version)
    except install.InstallError as exc:
        pytest.skip(f"{key}=={version} not installed and cannot be fetched: {exc}")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


# -- kvcheck install ----------------------------------------------------------------
@pytest.mark.parametrize("req, words", [
    ("sglang-nope", "unknown engine 'sglang-nope'"),
    ("vllm==0.1.0", "vllm 0.1.0 is not supported by any kvcheck adapter"),
    ("vllm-v1==0.6.3.post1", "not supported"),  # before v1's first KVCacheManager
    ("vllm", "names several engine generations"),
    ("vllm==", "no version"),
    ("sglang==0.4.3", "sglang 0.4.3 is not supported by any kvcheck adapter (sglang: "
                      "0.4.8 .. 0.5.23; sglang-hicache: 0.4.4.post2 .. 0.5.20; "
                      "sglang-unified: 0.5.12 .. 0.5.16)"),
    ("sglang-radix==0.5.21", "(sglang-radix: 0.5.22 .. 0.5.23)"),
])
def test_bad_requests_are_one_line_and_exit_2(req, words):
    p = _cli("install", req)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and words in p.stderr, p.stderr


def test_parse_maps_a_release_to_its_generation():
    assert install.parse("vllm==0.4.2") == (install.ENGINES["vllm-v0"], "0.4.2")
    assert install.parse("vllm==0.20.2") == (install.ENGINES["vllm-v1"], "0.20.2")
    assert install.parse("vllm==0.10.2") == (install.ENGINES["vllm-v1"], "0.10.2")
    assert install.parse("vllm-v1") == (install.ENGINES["vllm-v1"], "0.33.0")
    assert install.parse("sglang") == (install.ENGINES["sglang"], "0.5.23")
    assert install.parse("sglang==0.4.8") == (install.ENGINES["sglang"], "0.4.8")
    # v1's early releases: vllm-v1 names its family (vllm_v1_early), a plain vllm==0.8.5 v0
    early = install.ENGINES["vllm-v1-early"]
    assert install.parse("vllm-v1==0.6.4.post1") == (early, "0.6.4.post1")
    assert install.parse("vllm-v1==0.10.1.1") == (early, "0.10.1.1")
    assert install.parse("vllm==0.8.5") == (install.ENGINES["vllm-v0"], "0.8.5")
    assert install.select("vllm-v1", "0.7.0", with_family=True).key == "vllm-v1-early"
    assert install.select("vllm-v1", "0.10.2", with_family=True).key == "vllm-v1"
    with pytest.raises(install.InstallError, match="0.6.4.post1 .. 0.10.1.1, not 0.6.3"):
        install.select("vllm-v1", "0.6.3.post1", with_family=True)
    # an adapter of the vllm-v1 key that does not load the family keeps its range
    with pytest.raises(install.InstallError, match="0.10.2 .. 0.34.0, not 0.7.0"):
        install.select("vllm-v1", "0.7.0")
    assert install.version_key("0.5.0.post1") > install.version_key("0.5.0")
    assert install.version_key("0.5.0rc1") < install.version_key("0.5.0")


def test_an_installed_release_needs_no_network():
    p = _cli("install", "vllm-v1", env=OFFLINE)
    assert p.returncode == 0 and "already installed" in p.stdout, p.stderr


def test_offline_and_missing_is_one_line(tmp_path):
    p = _cli("install", "vllm==0.5.1", env={**OFFLINE, _loader.ENV_DIR: str(tmp_path)})
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "cannot fetch vllm==0.5.1 (offline?" in p.stderr, p.stderr
    assert not list(tmp_path.iterdir())  # nothing half-installed


def test_a_local_wheel_is_used_and_only_py_files_kept(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "vllm-0.4.2-cp311-cp311-manylinux1_x86_64.whl", "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm/core/block/block_table.py", "X = 1\n")
        z.writestr("vllm/_C.abi3.so", b"\0" * 64)
        z.writestr("vllm-0.4.2.dist-info/METADATA", "Name: vllm\nVersion: 0.4.2\n")
    monkeypatch.setenv(_loader.ENV_DIR, str(tmp_path / "tp"))
    monkeypatch.setenv(install.WHEEL_DIR_ENV, str(wheels))
    said: list[str] = []
    dest = install.install(install.ENGINES["vllm-v0"], "0.4.2", say=said.append)
    assert (dest / "vllm/core/block/block_table.py").read_text() == "X = 1\n"
    assert not (dest / "vllm/_C.abi3.so").exists()
    assert _loader.is_installed(install.ENGINES["vllm-v0"].dist_for("0.4.2"))
    install.install(install.ENGINES["vllm-v0"], "0.4.2", say=said.append)  # idempotent
    assert "already installed" in said[-1]


def test_an_unwritable_install_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for where in (blocker, blocker / "sub"):  # $KVCHECK_THIRDPARTY_DIR a file, or below one
        p = _cli("install", "vllm-v0==0.5.1", env={**OFFLINE, _loader.ENV_DIR: str(where)})
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"{blocker} is not a directory" in p.stderr and "internal error" not in p.stderr
    assert blocker.read_text() == ""


def test_a_corrupt_local_wheel_is_one_line(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "vllm-0.5.1-py3-none-any.whl").write_text("not a zip")
    p = _cli("install", "vllm-v0==0.5.1", env={**OFFLINE, _loader.ENV_DIR: str(tmp_path / "tp"),
                                               install.WHEEL_DIR_ENV: str(wheels)})
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "is not a wheel" in p.stderr
    assert not (tmp_path / "tp").exists() or not list((tmp_path / "tp").iterdir())


# -- TARGET@VERSION -------------------------------------------------------------------
def test_versioned_target_errors_are_one_line():
    p = _cli("verify", "vllm-v0@9.9", "--ops", "10")
    assert p.returncode == 2 and "vllm-v0 loads vllm 0.4.2 .. 0.9.2, not 9.9" in p.stderr
    p = _cli("verify", "reference@1", "--ops", "10")
    assert p.returncode == 2 and "has no versions" in p.stderr


@pytest.mark.parametrize("target", ["vllm-v0@", "kvcheck.impl.thirdparty.vllm_v0:make@"])
def test_an_empty_version_is_named_as_such(target, capsys):
    """Not 'has no versions' (vllm-v0 has) nor 'the factory takes no version' (it does)."""
    assert kvcheck(["verify", target, "--ops", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no version after '@'" in err, err


@pytest.mark.parametrize("version", ["0.4.3", "0.8.5", "0.9.2"])
@pytest.mark.parametrize("kind", ["naive", "prefix_caching"])
def test_v0_range_ends_pass_behind_the_engine_guard(version, kind):
    _have("vllm-v0", version)

    def factory(n, b):
        return vllm_v0.VllmV0Target(n, b, kind, guard="engine", version=version)

    t = factory(4, 2)
    assert t.version == version
    r = verify(factory, 8, 2, 1500, 0)
    assert r.ok, r.violation


@pytest.mark.parametrize("version", ["0.6.4.post1", "0.10.1.1"])
@pytest.mark.parametrize("command", ["verify", "verify-prefix"])
def test_v1_early_range_ends(version, command, capsys):
    """vllm-v1@VERSION before 0.10.2 is vllm_v1_early: its ends pass the block model at block
    sizes 1 and 2, and the prefix model at block size 1; at block size 2 0.6.4.post1's
    scheduler skips computing tokens of a fresh block (vLLM PR #11186: the catalogue's
    vllm-11186), 0.10.1.1 passes."""
    from kvcheck.impl.thirdparty import vllm_v1_early

    _have("vllm-v1-early", version)
    t = vllm_v1.make(4, 2, version=version)
    assert isinstance(t, vllm_v1_early.VllmV1EarlyTarget) and t.version == version
    for b in (1, 2):
        rc = kvcheck([command, f"vllm-v1@{version}", "--blocks", "8", "--block-size", str(b),
                      "--ops", "1500"])
        out = capsys.readouterr().out
        if command == "verify-prefix" and b == 2 and version == "0.6.4.post1":
            line = out.split("VIOLATION at step ", 1)[1].splitlines()[0]
            assert rc == 1 and "(contract): allocate:" in line and "cached tokens" in line, out
        else:
            assert rc == 0 and out.startswith(f"PASS vllm-v1@{version}:"), out
            assert (f"engine: vllm {version} from kvcheck install's sources in " in out
                    and "(not the pinned 0.33.0)" in out), out


def test_v1_early_generations_are_detected_by_feature():
    """What the adapter reads from each generation's files: the manager's API, the pool
    (no null block before 0.8.3: oracle ids are vLLM's), the scheduler's full-hit branch
    (vLLM PR #11186 in 0.6.4.post1), speculative slots from 0.7.3, lookahead from 0.8.4."""
    from kvcheck.impl.thirdparty import vllm_v1_early

    want = {"0.6.4.post1": (True, False, "token", 0, False, False),
            "0.7.2": (False, False, "block", 0, False, False),
            "0.8.0": (False, False, "block", 0, True, False),
            "0.8.4": (False, False, None, 1, True, True),
            "0.9.0": (False, True, None, 1, True, True)}
    for version, (g1, g3, edge, off, spec, lookahead) in want.items():
        _have("vllm-v1-early", version)
        t = vllm_v1_early.make(4, 2, version=version)
        got = (t._g1, t._g3, t._edge, t._off, "append_slots" in t.capabilities, t._lookahead)
        assert got == (g1, g3, edge, off, spec, lookahead), (version, got)
        t.allocate(0, 3)
        t.append_slot(0)
        assert t.block_table(0) == [0, 1] and t.num_free() == 2
        t.free_seq(0)
        assert t.num_free() == 4 and sorted(t.free_blocks()) == [0, 1, 2, 3]


def test_v1_early_preallocation_is_what_the_adapter_turns_off():
    """docs/thirdparty-notes.md D12: with the release's num_preallocate_tokens (64) a 1-token
    prompt takes every free block, which the spec's allocate contract (exactly ceil(n/B))
    forbids; the adapter's manager (0) takes one. 0.8.5 has no preallocation at all."""
    from kvcheck.impl.thirdparty import vllm_v1_early

    _have("vllm-v1-early", "0.7.0")
    _have("vllm-v1-early", "0.8.5")
    for prealloc, blocks in ((64, 8), (0, 1)):
        t = vllm_v1_early.VllmV1EarlyTarget(8, 2, version="0.7.0", preallocate_tokens=prealloc)
        t.allocate(0, 1)
        assert len(t.block_table(0)) == blocks and t.num_free() == 8 - blocks
    t = vllm_v1_early.VllmV1EarlyTarget(8, 2, version="0.8.5", preallocate_tokens=64)
    t.allocate(0, 1)
    assert len(t.block_table(0)) == 1


@pytest.mark.parametrize("version", ["0.10.2", "0.33.0", "0.34.0"])
def test_v1_range_ends_pass(version, capsys):
    _have("vllm-v1", version)
    assert vllm_v1.make(4, 2, version=version).version == version
    assert kvcheck(["verify", f"vllm-v1@{version}", "--blocks", "8", "--block-size", "2",
                    "--ops", "1500"]) == 0
    # the prefix cache read back: 0.34.0 keeps block ids in its hash map (one per key,
    # every id of a key several blocks hold in ``_dup_ids``), earlier releases blocks
    t = vllm_v1.make(4, 2, version=version)
    t.allocate(0, 4, [1, 2, 3, 4])
    t.allocate(1, 4, [1, 2, 3, 4])  # hits the first block; the last token is recomputed, so
    # its second block is a new one, cached under the key of request 0's second: two blocks
    # under one key (0.34.0: the key's ids in ``_dup_ids``)
    a, b = t.block_table(0), t.block_table(1)
    assert a[0] == b[0] and a[1] != b[1], (a, b)
    entries = t.cache_entries()
    assert sorted(blk for _, blk in entries) == sorted({*a, *b}), entries
    assert len({key for key, _ in entries}) == 2, entries
    out = capsys.readouterr().out
    assert out.startswith(f"PASS vllm-v1@{version}:")
    if version == install.ENGINES["vllm-v1"].pinned:
        assert f"engine: vllm {version} from the pinned sources" in out
    else:  # a release of the range that is not the pin is not called pinned
        assert (f"engine: vllm {version} from kvcheck install's sources in " in out
                and "pinned sources" not in out and "(not the pinned 0.33.0)" in out), out


def test_the_environments_vllm_is_checked(tmp_path):
    """A vLLM importable in the user's environment (here a site folder on PYTHONPATH holding
    0.10.2's files and metadata) is what a plain ``vllm-v1`` checks, its version printed;
    ``@pinned`` still takes the pinned sources."""
    _have("vllm-v1", "0.10.2")
    src = install.find(install.ENGINES["vllm-v1"], "0.10.2")
    site = tmp_path / "site"
    site.mkdir()
    (site / "vllm").symlink_to(src / "vllm")
    (site / "vllm-0.10.2.dist-info").symlink_to(src / "vllm-0.10.2.dist-info")
    env = {"PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    p = _cli("verify", "vllm-v1", "--blocks", "6", "--block-size", "2", "--ops", "300", env=env)
    assert p.returncode == 0, p.stderr
    assert f"engine: vllm 0.10.2 installed in this environment ({site})" in p.stdout
    p = _cli("verify", "vllm-v1@pinned", "--ops", "100", env=env)
    assert p.returncode == 0 and "engine: vllm 0.33.0 from the pinned sources" in p.stdout
    # an environment's vLLM outside the range is not checked, and the verdict says so
    p = _cli("verify", "vllm-v0", "--blocks", "6", "--block-size", "2", "--ops", "100", env=env)
    assert ("engine: vllm 0.8.5 from the pinned sources" in p.stdout and
            "(the vllm 0.10.2 of this environment is outside vllm-v0's range 0.4.2 .. 0.9.2)"
            in p.stdout), p.stdout[-600:]


def test_the_environments_early_v1_vllm_is_checked(tmp_path):
    """An environment's vLLM of v1's first releases (0.9.2 here) is what a plain ``vllm-v1``
    checks, through vllm_v1_early (the family row), its version printed."""
    _have("vllm-v1-early", "0.9.2")
    src = install.find(install.ENGINES["vllm-v1-early"], "0.9.2")
    site = tmp_path / "site"
    site.mkdir()
    (site / "vllm").symlink_to(src / "vllm")
    (site / "vllm-0.9.2.dist-info").symlink_to(src / "vllm-0.9.2.dist-info")
    env = {"PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    for target in ("vllm-v1", "vllm-v1@installed"):
        p = _cli("verify", target, "--blocks", "6", "--block-size", "2", "--ops", "300",
                 env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"engine: vllm 0.9.2 installed in this environment ({site})" in p.stdout


def test_a_factory_with_a_version_keyword_takes_at_version():
    _have("vllm-v0", "0.4.3")
    p = _cli("verify", "kvcheck.impl.thirdparty.vllm_v0:make_guarded@0.4.3", "--blocks", "6",
             "--block-size", "2", "--ops", "300")
    assert p.returncode == 0 and p.stdout.startswith(
        "PASS kvcheck.impl.thirdparty.vllm_v0:make_guarded@0.4.3:"), p.stderr
    p = _cli("verify", "kvcheck.impl.block_manager:BlockManager@1", "--ops", "10")
    assert p.returncode == 2 and "the factory takes no version" in p.stderr


def test_verify_prefix_allows_a_documented_deviation():
    """vLLM v0 swaps a completed block for its cached twin (finding F5, deviation D8): with
    that clause allowed, the run goes on past it, counts it, and passes."""
    _have("vllm-v0", "0.8.5")
    args = ["verify-prefix", "kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded@0.8.5",
            "--blocks", "8", "--block-size", "2", "--ops", "1500"]
    assert _cli(*args).returncode == 1
    p = _cli(*args, "--allow", "append_slot: the sole holder of a partial block writes in place",
             "--allow", "append_slot: a new block was free")
    assert p.returncode == 0, p.stdout[-2000:]
    assert p.stdout.startswith("ALLOWED ") and "every structural and prefix-cache rule held" in (
        p.stdout)


def test_a_versioned_trace_replays_raw_on_its_release(tmp_path):
    """``scripts/replay_raw.py`` replays a ``vllm-v0@0.4.3`` trace on 0.4.3's own objects:
    F6 (a reservation that runs out of blocks keeps what it took) is there too."""
    _have("vllm-v0", "0.4.3")
    trace = tmp_path / "t.json"
    p = _cli("verify", "vllm-v0@0.4.3", "--blocks", "6", "--block-size", "2", "--ops", "500",
             "--trace-out", str(trace))
    assert p.returncode == 1, p.stderr
    r = subprocess.run([sys.executable, "scripts/replay_raw.py", str(trace)], capture_output=True,
                       text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr
    assert "version='0.4.3'" in r.stdout and "DEVIATION" in r.stdout


def test_install_list_shows_ranges_and_what_is_installed():
    p = _cli("install", "--list")
    assert p.returncode == 0, p.stderr
    lines = {ln.split(":")[0]: ln for ln in p.stdout.splitlines()}
    assert set(install.ENGINES) <= set(lines)
    assert "vllm 0.10.2 .. 0.34.0 (pinned 0.33.0)" in lines["vllm-v1"]
    assert "vllm 0.6.4.post1 .. 0.10.1.1" in lines["vllm-v1-early"]
    assert "0.33.0" in lines["vllm-v1"].split("installed:")[1]


def test_install_list_of_named_engines_only():
    p = _cli("install", "vllm-v1", "nano-vllm==20260210", "--list")
    assert p.returncode == 0, p.stderr
    # vllm-v1 names its family too (vllm-v1-early: install vllm-v1==0.9.0 reaches it)
    assert [ln.split(":")[0] for ln in p.stdout.splitlines()] == ["vllm-v1", "vllm-v1-early",
                                                                  "nano-vllm"]
    bad = _cli("install", "no-such-engine", "--list")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "unknown engine 'no-such-engine'" in bad.stderr


def test_an_allowed_deviation_does_not_hide_a_later_bug():
    """With F5's clauses allowed, vLLM PR #5364 on 0.5.0.post1 (a block reused from the
    evictor keeps its computed mark) is still reported, and 0.5.1 passes."""
    _have("vllm-v0", "0.5.0.post1")
    _have("vllm-v0", "0.5.1")
    allow = ["--allow", "append_slot: the sole holder of a partial block writes in place",
             "--allow", "append_slot: a new block was free"]
    base = ["verify-prefix", "--blocks", "8", "--block-size", "2", "--ops", "3000", *allow]
    target = "kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded@"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", base[0], target + "0.5.0.post1",
                        *base[1:]], capture_output=True, text=True, cwd=root)
    assert p.returncode == 1, p.stderr
    assert "allocate: every block the cached tokens skip holds the requested prefix" in p.stdout
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", base[0], target + "0.5.1",
                        *base[1:]], capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stdout[-1500:]


def test_nano_vllm_npu_stale_key_is_caught():
    """nano-vllm-npu 0.0.2 keeps a freed block's key (nano-vllm #163): the prefix model
    reports the stale key in a few operations (see benchmarks/historical, nano-vllm-163)."""
    _have("nano-vllm-npu", "0.0.2")
    from kvcheck.impl.thirdparty import nano_vllm_upstream

    assert nano_vllm_upstream.make(4, 2).version == "0.0.2"
    p = _cli("verify-prefix", "kvcheck.impl.thirdparty.nano_vllm_upstream:make@0.0.2",
             "--blocks", "8", "--block-size", "2", "--ops", "3000", "--seed", "0", "--json")
    assert p.returncode == 1, p.stderr
    v = json.loads(p.stdout)["violation"]
    stale_key = {"allocate: cache hit returns a block holding the requested prefix",
                 "no_partial_cached", "one_key_per_block"}  # the false hit, or its stale key
    assert v["violation"]["name"] in stale_key and len(v["ops"]) <= 4, v["violation"]


def test_the_v1_sliding_window_adapter_takes_a_release():
    """``vllm-v1-sliding@0.20.2``: the window adapter on another release of v1's range (its
    ``remove_skipped_blocks`` without ``num_prompt_tokens``)."""
    _have("vllm-v1", "0.20.2")
    from kvcheck.impl.thirdparty import vllm_v1_sliding

    assert vllm_v1_sliding.make(4, 2, version="0.20.2").version == "0.20.2"
    p = _cli("verify", "vllm-v1-sliding@0.20.2", "--blocks", "8", "--block-size", "2",
             "--ops", "1500")
    assert p.returncode == 0 and "engine: vllm 0.20.2 from kvcheck install's sources" in p.stdout, (
        p.stdout[-800:] + p.stderr)


@pytest.mark.parametrize("target,engine", [("vllm-v0-sliding", "vllm 0.8.5"),
                                           ("vllm-v1-lifecycle", "vllm 0.33.0")])
def test_every_vllm_adapter_names_its_release(target, engine, capsys):
    """The adapters built on vllm_v0 / vllm_v1 without a version of their own load the
    same sources: their verdict names them too (it had no engine line), and they take
    no @VERSION (a one-line error, not a TypeError from the factory)."""
    assert kvcheck(["verify", target, "--blocks", "8", "--ops", "20"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(f"engine: {engine} from the pinned sources"), out
    assert kvcheck(["verify", f"{target}@0.20.2", "--ops", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"target {target!r} has no versions" in err, err
