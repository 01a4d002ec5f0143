import sys
from pathlib import Path

# The buggy-allocator corpus is importable as `corpus` from every test.
sys.path.insert(0, str(Path(__file__).parent))

# KVCHECK_NO_SKIPS=1 (scripts/test.sh): a skip is a failure (tests/no_skips.py).
from no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402, F401
