#!/usr/bin/env bash
# Install everything the test suite needs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Nothing is skipped (README): once everything is installed, a test that would skip fails,
# saying why (tests/no_skips.py).
export KVCHECK_NO_SKIPS=1
python3 -m pip install -q -e '.[test]'
bash scripts/install_thirdparty.sh vllm-v1 vllm-v0 nano-vllm sglang aphrodite vllm-v0-legacy==0.3.3 vllm-v0-legacy==0.4.0 sglang==0.4.8 sglang==0.5.2 sglang==0.5.3 sglang==0.5.12.post1 sglang==0.5.13 sglang==0.5.14 sglang==0.5.21 sglang==0.5.22 sglang==0.4.4.post3 sglang==0.4.5 sglang==0.4.5.post2 sglang==0.4.5.post3 sglang==0.4.6 sglang==0.4.10.post2 sglang==0.5.5.post3 sglang==0.5.6 sglang==0.5.10 sglang==0.5.20  # every adapted engine, the #1556 pair, the SGLang range's ends, the #34399, #27779, S1 and HiCache #4989, #5499 pairs, #27631's releases, #13501's pair, HiCache's later code paths and UnifiedRadixCache's #24585 pair
# BlockSpaceManager v1's later releases and aphrodite's copy of it (tests/thirdparty/test_vllm_v0_legacy.py)
bash scripts/install_thirdparty.sh vllm-v0-legacy==0.4.1 vllm-v0-legacy==0.4.2 vllm-v0-legacy==0.4.3 vllm-v0-legacy==0.5.0.post1 vllm-v0-legacy==0.5.1 vllm-v0-legacy==0.5.2 vllm-v0-legacy==0.5.3.post1 vllm-v0-legacy==0.5.4 vllm-v0-legacy==0.5.5 vllm-v0-legacy==0.6.0 vllm-v0-legacy==0.6.1.post2 vllm-v0-legacy==0.6.2 aphrodite-legacy==0.5.1 aphrodite-legacy==0.6.0
# vLLM v0's swapping under the tiers model, the #6849 and #8824 pairs (tests/thirdparty/test_vllm_v0_swap.py)
bash scripts/install_thirdparty.sh vllm-v0==0.4.3 vllm-v0==0.5.4 vllm-v0==0.5.5 vllm-v0==0.6.2 vllm-v0==0.6.3.post1
# the SimpleCPUOffload connector under the tiers model, the #42571 pairs (tests/thirdparty/test_vllm_v1_offload.py), and the native OffloadingConnector: 0.11.0 and 0.17.0 (jobs keyed by request), #34576 on 0.16.0 (and 0.11.1, its first ARC release: the raw replay in tests/thirdparty/test_historical.py), 0.21.0 .. 0.32.0 and #49118's pair (test_vllm_v1_native_offload.py)
bash scripts/install_thirdparty.sh vllm-v1==0.11.0 vllm-v1==0.11.1 vllm-v1==0.16.0 vllm-v1==0.17.0 vllm-v1==0.20.2 vllm-v1==0.21.0 vllm-v1==0.22.0 vllm-v1==0.23.0 vllm-v1==0.24.0 vllm-v1==0.25.1 vllm-v1==0.26.0 vllm-v1==0.27.0 vllm-v1==0.32.0 vllm-v1==0.34.0 aphrodite==0.21.0 aphrodite==0.22.0
# vLLM v1's engine core through its own scheduler, the #19459 pair, the early scheduler's code paths and the #10730 / #11186 pair (tests/thirdparty/test_vllm_v1_engine.py)
bash scripts/install_thirdparty.sh vllm-v1-early==0.6.4.post1 vllm-v1-early==0.6.5 vllm-v1-early==0.7.0 vllm-v1-early==0.7.2 vllm-v1-early==0.8.0 vllm-v1-early==0.8.4 vllm-v1-early==0.8.5 vllm-v1-early==0.9.0 vllm-v1-early==0.9.1 vllm-v1==0.10.2  # and docs/traces/engine's releases
# vllm-v1-engine on the releases whose stand-ins differ: the ranges' ends and edges, the releases mended for (tests/thirdparty/test_vllm_v1_engine_releases.py)
bash scripts/install_thirdparty.sh vllm-v1-early==0.7.3 vllm-v1-early==0.8.2 vllm-v1-early==0.8.3 vllm-v1-early==0.10.1.1 vllm-v1==0.11.1 vllm-v1==0.14.0 vllm-v1==0.15.1 vllm-v1==0.28.0 vllm-v1==0.30.0
# nano-vllm's engine core through upstream's scheduler and the #163 release (tests/thirdparty/test_nano_vllm_engine.py)
bash scripts/install_thirdparty.sh nano-vllm-npu==0.0.2
# vLLM v0's engine core through its own scheduler, the #18957 fix and two of the range 0.6 .. 0.8.4 (0.5.3.post1, 0.6.3.post1: above) (tests/thirdparty/test_vllm_v0_engine.py)
bash scripts/install_thirdparty.sh vllm-v0==0.9.2 vllm-v0==0.6.4.post1 vllm-v0==0.7.3
# aphrodite-engine's v0 engine core through its own scheduler, the #679 pair (tests/thirdparty/test_aphrodite_v0_engine.py)
bash scripts/install_thirdparty.sh aphrodite-v0==0.6.0.post1 aphrodite-v0==0.6.1 aphrodite-v0==0.6.5
# a headless browser for the HTML report test: one line says which, what it installed, or why
# none can run (not root, no passwordless sudo, no apt-get); the suite goes on, and that test
# then fails with the line (nothing is skipped)
bash scripts/install_chromium.sh || true
# Bounded proofs of the reference, as a CI gate (a few minutes at this scope).
kvcheck prove reference --blocks 6 --block-size 2 --seqs 3 --depth 5 --budget 900 --junit prove-junit.xml
# The suite, one pytest process per test directory (a process running all ~3,000 tests
# accumulates solver and interpreter state and runs far slower than the parts), two at a
# time on the two cores: each lane takes the next directory as soon as its last one ends,
# the longest first (tests/core, tests/thirdparty, tests/proofs, ...: about 6, 5 and 4
# minutes), so the lanes end close together. Every directory's result counts; each one's
# output is printed whole, in the order below, once all have ended (a line says when each
# one ends, with its exit status and seconds).
first="tests/core tests/thirdparty tests/proofs tests/device tests/campaign tests/traces tests/prefix"
dirs=$first
for d in tests/*/; do
    d=${d%/}
    case " $first tests/corpus tests/__pycache__ " in *" $d "*) continue ;; esac  # corpus: modules only
    dirs="$dirs $d"
done
logs=$(mktemp -d)
export logs
# shellcheck disable=SC2016
printf '%s\n' $dirs | xargs -P 2 -I{} sh -c \
    'f="$logs/$(echo {} | tr / _)"; t=$(date +%s); python3 -m pytest {} >"$f.log" 2>&1
     rc=$?; echo $rc >"$f.rc"; echo "-- {} ended: exit $rc, $(( $(date +%s) - t )) s"'
status=0
for d in $dirs; do
    f="$logs/$(echo "$d" | tr / _)"
    echo "== $d"
    cat "$f.log"
    [ "$(cat "$f.rc" 2>/dev/null)" = 0 ] || { echo "== $d: FAILED (exit $(cat "$f.rc" 2>/dev/null || echo none))"; status=1; }
done
rm -rf "$logs"
exit "$status"
