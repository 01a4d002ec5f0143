#!/usr/bin/env bash
# kvcheck as a CI gate: prove and verify one allocator, keep JUnit, traces and the HTML
# report, fail only on FAIL. INCONCLUSIVE (a budget cut the work short) is a warning.
#
#   bash kvcheck-gate.sh TARGET [OUT_DIR]          (docs/ci/README.md; used by kvcheck.yml)
#
# TARGET: what `kvcheck verify` takes (a registered name, module:Attr, file.py:Attr).
# Environment (optional): KVCHECK_BLOCKS (8), KVCHECK_BLOCK_SIZE (2) for verify, KVCHECK_OPS (10000),
# KVCHECK_SEED (0), KVCHECK_PROVE_BLOCKS (6: prove at 6 blocks x 2, 3 sequences, depth 5),
# KVCHECK_PROVE_BUDGET (600 seconds; 0 skips prove), KVCHECK (the
# command, default: kvcheck).
# Exit: 0 PASS or INCONCLUSIVE (with a ::warning:: line), 1 a FAIL, 2 bad input, 3 an
# internal error of kvcheck.
set -uo pipefail
target=${1:?usage: kvcheck-gate.sh TARGET [OUT_DIR]}
out=${2:-kvcheck-out}
kv=${KVCHECK:-kvcheck}
blocks=${KVCHECK_BLOCKS:-8}
bs=${KVCHECK_BLOCK_SIZE:-2}
mkdir -p "$out" || exit 2
worst=0  # 0 pass, 4 inconclusive, 1 fail, 3 internal, 2 bad input (in that order of weight)

judge() {  # NAME RC
    local name=$1 rc=$2
    case "$rc" in
        0) echo "kvcheck gate: $name: PASS" ;;
        4) echo "::warning title=kvcheck $name inconclusive::$name did not decide everything (see $out/$name.txt); not a failure"
           [ "$worst" -eq 0 ] && worst=4 ;;
        1) echo "::error title=kvcheck $name failed::$name found a counterexample (see $out/$name.txt and $out/$name.html)"
           [ "$worst" -ne 2 ] && [ "$worst" -ne 3 ] && worst=1 ;;
        2) echo "::error title=kvcheck $name: bad input::$(tail -n 1 "$out/$name.txt")"; worst=2 ;;
        *) echo "::error title=kvcheck $name: internal error::exit $rc (see $out/$name.txt)"
           [ "$worst" -ne 2 ] && worst=3 ;;
    esac
}

if [ "${KVCHECK_PROVE_BUDGET:-600}" != 0 ]; then
    "$kv" prove "$target" --blocks "${KVCHECK_PROVE_BLOCKS:-6}" --block-size 2 --seqs 3 --depth 5 \
        --budget "${KVCHECK_PROVE_BUDGET:-600}" --junit "$out/prove-junit.xml" \
        --trace-out "$out/prove.json" >"$out/prove.txt" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] && [ -f "$out/prove.json" ] && "$kv" report "$out/prove.json" -o "$out/prove.html" >/dev/null 2>&1
    judge prove "$rc"
fi

"$kv" verify "$target" --blocks "$blocks" --block-size "$bs" --ops "${KVCHECK_OPS:-10000}" \
    --seed "${KVCHECK_SEED:-0}" --junit "$out/verify-junit.xml" --trace-out "$out/verify.json" \
    >"$out/verify.txt" 2>&1
rc=$?
[ "$rc" -eq 1 ] && [ -f "$out/verify.json" ] && "$kv" report "$out/verify.json" -o "$out/verify.html" >/dev/null 2>&1
judge verify "$rc"

cat "$out"/*.txt
[ "$worst" -eq 4 ] && exit 0
exit "$worst"
