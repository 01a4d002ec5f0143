"""Install the pinned third-party allocators once per session if they are missing.

The adapters' tests must run, not skip, on a fresh machine: when a package is
not installed, ``scripts/install_thirdparty.sh`` installs it (about 10 s for all
three; ~70 MB of Python files under ``~/.cache/kvcheck/thirdparty``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def thirdparty_installed() -> None:
    missing = [d.key for d in _loader.DISTS.values() if not _loader.is_installed(d)]
    if missing:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "install_thirdparty.sh"), *missing],
            check=True,
            env={**os.environ, "PYTHON": sys.executable},
        )
