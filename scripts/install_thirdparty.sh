#!/usr/bin/env bash
# Install the pinned third-party allocators that impl/thirdparty/ adapts.
#
#   bash scripts/install_thirdparty.sh [vllm-v1] [vllm-v0] [nano-vllm] [sglang] [aphrodite]
#   (default: vllm-v1 vllm-v0 nano-vllm; sglang and aphrodite are optional, asked for by name)
#
# Each goes into its own directory, $KVCHECK_THIRDPARTY_DIR/<dist>-<version>/
# (default ~/.cache/kvcheck/thirdparty/), never into site-packages: both vLLM
# versions are named `vllm`, and only a few of their module files are used.
#
# * vLLM wheels are ~330 MB each, almost all compiled CUDA kernels. We
#   `pip download --no-deps` the wheel into a temporary directory, extract only
#   the package's *.py files (vllm 0.33.0: ~57 MB, vllm 0.8.5: ~12 MB) and delete
#   the wheel. `pip install --no-deps --target` would unpack ~1 GB of .so files
#   that nothing here loads.
# * sglang 0.5.23 (optional): a 39 MB cp311 wheel; its *.py files (~68 MB) are
#   extracted the same way (impl/thirdparty/sglang.py loads four allocator files).
#   Its allocators run on torch CPU tensors: install torch==2.13.0 (test extras).
# * aphrodite-engine 0.24.1 (optional, a vLLM v1 fork): a 336 MB wheel, ~41 MB of *.py.
# * nano-vllm-fork is a 28 KB pure-Python wheel: `pip install --no-deps --target`.
# * xxhash (nano-vllm's hash) and numpy are real runtime dependencies of the
#   loaded modules and are installed normally into the current interpreter.
#
# Idempotent: a directory whose marker names the pinned version is left alone.
set -euo pipefail

PY=${PYTHON:-python3}
BASE=${KVCHECK_THIRDPARTY_DIR:-$HOME/.cache/kvcheck/thirdparty}
MARKER=.kvcheck-installed

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(vllm-v1 vllm-v0 nano-vllm)

installed() {  # dir dist==version
    [ -f "$1/$MARKER" ] && [ "$(cat "$1/$MARKER")" = "$2" ]
}

install_py_only() {  # dist version top
    local dist=$1 version=$2 top=$3
    local dest="$BASE/$dist-$version"
    if installed "$dest" "$dist==$version"; then
        echo "$dist $version: already installed in $dest"
        return
    fi
    local tmp
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    echo "$dist $version: downloading wheel (no deps)..."
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp/wheel" "$dist==$version"
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    "$PY" - "$tmp/wheel" "$dest.partial" "$top" <<'EOF'
import sys, zipfile, pathlib
wheel_dir, dest, top = sys.argv[1:]
(whl,) = pathlib.Path(wheel_dir).glob("*.whl")
n = 0
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(top + "/") and name.endswith(".py") or ".dist-info/" in name and name.endswith(("METADATA", "LICENSE", "RECORD")):
            z.extract(name, dest)
            n += 1
print(f"  extracted {n} files from {whl.name}")
EOF
    echo "$dist==$version" > "$dest.partial/$MARKER"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    echo "$dist $version: installed in $dest"
}

install_target() {  # dist version
    local dist=$1 version=$2
    local dest="$BASE/$dist-$version"
    if installed "$dest" "$dist==$version"; then
        echo "$dist $version: already installed in $dest"
        return
    fi
    rm -rf "$dest.partial"
    "$PY" -m pip install --quiet --no-deps --target "$dest.partial" "$dist==$version"
    echo "$dist==$version" > "$dest.partial/$MARKER"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    echo "$dist $version: installed in $dest"
}

need_runtime_deps=0
mkdir -p "$BASE"
for key in "${want[@]}"; do
    case $key in
        vllm-v1) install_py_only vllm 0.33.0 vllm ;;
        vllm-v0) install_py_only vllm 0.8.5 vllm ;;
        nano-vllm) install_target nano-vllm-fork 20260210; need_runtime_deps=1 ;;
        sglang) install_py_only sglang 0.5.23 sglang ;;
        aphrodite) install_py_only aphrodite-engine 0.24.1 aphrodite ;;
        *) echo "unknown third-party package '$key' (known: vllm-v1 vllm-v0 nano-vllm sglang aphrodite)" >&2; exit 2 ;;
    esac
done

if [ $need_runtime_deps = 1 ] && ! "$PY" -c "import xxhash, numpy" 2>/dev/null; then
    "$PY" -m pip install --quiet xxhash numpy
fi
