#!/usr/bin/env bash
# Install everything the test suite needs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
bash scripts/install_thirdparty.sh vllm-v1 vllm-v0 nano-vllm sglang aphrodite vllm-v0-legacy==0.3.3 vllm-v0-legacy==0.4.0  # every adapted engine, and the #1556 pair
bash scripts/install_chromium.sh
# Bounded proofs of the reference, as a CI gate (a few minutes at this scope).
kvcheck prove reference --blocks 6 --block-size 2 --seqs 3 --depth 5 --budget 240 --junit prove-junit.xml
python3 -m pytest tests
