"""Device tests: on the CPU the Triton kernels run under Triton's interpreter.

``TRITON_INTERPRET=1`` is set here, before anything imports triton, when no
GPU is present; on a CUDA machine nothing is set and the same tests run the
compiled kernels (``scripts/gpu_check.sh`` runs them so, with
``TRITON_INTERPRET`` unset), and the CUDA context is made here, once, so that
no test's first watched call (some allow 0.5 s) pays for it. The session's
header says which (``kvcheck device tests: ...``). torch and triton are test
dependencies (the ``test`` extra), so these tests never skip for want of them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if torch.cuda.is_available():
    torch.zeros(1, device="cuda")
else:
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).parent))  # `import device_bugs`

import pytest  # noqa: E402

from kvcheck.impl.device.kernels import interpreting  # noqa: E402
from kvcheck.impl.device.store import default_device  # noqa: E402

DEVICE = default_device()
SHAPE = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 3}  # a row of 6: not a power of two


def pytest_report_header(config):
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "no GPU"
    kernels = "interpreted (TRITON_INTERPRET=1)" if interpreting() else "compiled"
    return f"kvcheck device tests: device {DEVICE.type} ({where}), Triton kernels {kernels}"


@pytest.fixture(params=["triton", "torch"])
def backend(request) -> str:
    return request.param


@pytest.fixture(params=["float16", "bfloat16", "float32"])
def dtype(request) -> str:
    return request.param
