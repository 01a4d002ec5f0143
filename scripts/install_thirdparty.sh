#!/usr/bin/env bash
# Install the pinned third-party allocators that impl/thirdparty/ adapts.
#
#   bash scripts/install_thirdparty.sh [ENGINE[==VERSION] ...]   (default: vllm-v1 vllm-v0 nano-vllm)
#   bash scripts/install_thirdparty.sh vllm-v1 vllm-v0 nano-vllm sglang aphrodite   (every adapted engine)
#
# A thin wrapper of `kvcheck install` (impl/thirdparty/install.py, which says what
# is installed where): each release goes into its own directory,
# $KVCHECK_THIRDPARTY_DIR/<dist>-<version>/ (default ~/.cache/kvcheck/thirdparty/),
# never into site-packages; of a vLLM wheel only the *.py files are kept.
# Idempotent: an installed release is left alone, without network access.
set -euo pipefail

PY=${PYTHON:-python3}
if ! "$PY" -c "import kvcheck.impl.thirdparty.install" 2>/dev/null; then
    echo "install_thirdparty.sh: kvcheck is not importable by $PY: run 'pip install .' first" >&2
    exit 2
fi
exec "$PY" -m kvcheck.impl.thirdparty.install "$@"
