"""kvcheck.compile.codecache: generated checks compiled once per machine, never stale, and
a cache that cannot be used only costs the compile."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import MAGIC_NUMBER

import pytest

from kvcheck.compile import codecache

SOURCE = "def f(x):\n    return x + 1\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(codecache.ENV, str(tmp_path / "cache"))
    return codecache.directory()


def test_a_source_is_compiled_once_and_read_back(cache):
    assert codecache.define(SOURCE, "<test f>", "f")(1) == 2
    (entry,) = list(cache.iterdir())
    stamp = entry.stat().st_mtime_ns
    f = codecache.define(SOURCE, "<test f>", "f")
    assert f(41) == 42 and f.__code__.co_filename == "<test f>"
    assert list(cache.iterdir()) == [entry] and entry.stat().st_mtime_ns == stamp


def test_other_text_is_another_entry_never_the_old_code(cache):
    assert codecache.define(SOURCE, "<test f>", "f")(1) == 2
    assert codecache.define(SOURCE.replace("+ 1", "+ 2"), "<test f>", "f")(1) == 3
    assert codecache.define(SOURCE, "<test g>", "f").__code__.co_filename == "<test g>"
    assert len(list(cache.iterdir())) == 3


def test_a_damaged_entry_is_compiled_again_and_replaced(cache):
    codecache.define(SOURCE, "<test f>", "f")
    (entry,) = list(cache.iterdir())
    for damage in (b"", b"\x00garbage", entry.read_bytes()[:10]):
        entry.write_bytes(damage)
        assert codecache.define(SOURCE, "<test f>", "f")(1) == 2
    assert codecache.define(SOURCE, "<test f>", "f")(2) == 3
    assert entry.read_bytes() != b"" and not [p for p in cache.iterdir() if p != entry]


def test_off_writes_nothing(tmp_path, monkeypatch):
    for off in ("off", "0", ""):
        monkeypatch.setenv(codecache.ENV, off)
        assert codecache.directory() is None
        assert codecache.define(SOURCE, "<test f>", "f")(1) == 2
    assert not list(tmp_path.iterdir())


def test_an_unusable_directory_only_costs_the_compile(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(codecache.ENV, str(blocker / "below"))  # a directory under a file
    assert codecache.define(SOURCE, "<test f>", "f")(1) == 2


def test_the_checks_a_process_compiles_are_kept_for_the_next(tmp_path):
    env = {**os.environ, codecache.ENV: str(tmp_path)}
    probe = ("import kvcheck.models.blocks.oracle, kvcheck.models.prefix.compiled; "
             "from kvcheck.models.blocks import fused; "
             "print(fused.step('append_slot').__code__.co_filename)")
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=env, timeout=120)
        assert p.returncode == 0 and p.stdout.strip() == "<kvcheck fused fused_append_slot_ok>", \
            p.stderr
        kept = sorted(p.name for p in (tmp_path / MAGIC_NUMBER.hex()).iterdir())
        assert len(kept) > 20, kept  # the step checks, the fused steps, the prefix invariants
    assert not [name for name in kept if name.startswith(".part-")]
