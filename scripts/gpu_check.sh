#!/usr/bin/env bash
# The device KV store (impl/device) on a real GPU, in one command (issue 36).
#
# On a machine with CUDA, in at most 8 minutes (each stage under its own cap, its result
# written into the results file as soon as it ends, so a hang in one still returns the others):
#   env     GPU name, driver, CUDA, torch, triton, python; what was missing and was installed
#           offline from carried wheels (.whl/); kvcheck made importable from this checkout
#   tests   pytest tests/device on CUDA with compiled Triton kernels (TRITON_INTERPRET unset)
#   verify  kvcheck verify-device (the registered store; 8 KV heads x 128, 4 layers), kvcheck
#           verify device, and the data-level corpus (tests/device/device_bugs.py), Triton backend
#   bench   benchmarks/device.py: copy_blocks, write_slots and gather each against a same-run
#           dst.copy_(src) of the same bytes (goal: >= 0.80 each), and the batched decode step, at
#           Llama 3.3 70B's per-GPU shape (tp 8 and tp 4: 80 layers, 1 or 2 KV heads, head dim
#           128, block 16, 256 sequences of 1,000 tokens, bf16), and the benchmark's default
# Results: gpu_check.json (every figure, with the GPU's name, driver and versions),
# gpu_check.txt (a short summary, also printed last) and gpu_check.log (every command's output),
# in --out DIR, else $OUT, else a new temporary folder.
#
# Exit codes: 0 every stage ran and every check held (the bandwidth figures never change it);
# 3 every stage ran but a check failed (a test, a violation on the correct store, a corpus bug
# not caught, a benchmark step read back wrong); 4 a stage did not complete (ran past its cap,
# crashed, could not start); 5 no CUDA device here (one line on stderr, nothing run or written);
# 2 bad arguments.
#
#   scripts/gpu_check.sh --dry-run [--out DIR]   every stage on the CPU, Triton interpreted,
#                                                 tiny shapes (tests/device/test_gpu_check.py runs it)
#   scripts/gpu_check.sh --fetch-wheels [DIR]    here, with a registry: the wheels the device
#                                                 machine lacks (z3-solver, hypothesis) into .whl/
#   scripts/gpu_check.sh --only bench            a rerun of some stages (env always runs)
#   scripts/gpu_check.sh --help                  every option
#
# With the device tool (docs/device.md, "Running on a GPU"): once, here,
#     bash scripts/gpu_check.sh --fetch-wheels        # .whl/: z3-solver, hypothesis (~39 MB, git-ignored)
# then one call of the device tool's run:
#     command:   bash scripts/gpu_check.sh --out "$OUT"
#     carry:     [".whl"]
#     timeout_s: 540
# The machine has no network: torch and triton are its own (CUDA builds; their versions go into
# the results), the rest of what kvcheck's device path imports is there or comes from .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "no CUDA device usable here: no Python ($PY) to run torch; scripts/gpu_check.sh needs python3 (exit 5)" >&2
    exit 5
fi
exec "$PY" scripts/gpu_check.py "$@"
