"""Fixtures for the trace tests (helpers live in ``traces_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from traces_helpers import CORPUS  # noqa: E402


@pytest.fixture(params=sorted(CORPUS))
def corpus_name(request) -> str:
    return request.param
