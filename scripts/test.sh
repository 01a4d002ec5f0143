#!/usr/bin/env bash
# Install everything the test suite needs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
bash scripts/install_thirdparty.sh
python3 -m pytest tests
