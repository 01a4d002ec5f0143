#!/usr/bin/env bash
# A headless browser for the HTML report test (tests/traces/test_report_browser.py).
#
# One already installed is used: $KVCHECK_BROWSER if set, else the first of chromium,
# chromium-browser, google-chrome, google-chrome-stable on PATH. Only without one is Debian's
# chromium installed, and only where this user can: as root, or with passwordless sudo, and
# with apt-get. Prints one line: the browser used (its path is the line's last word), what was
# installed, or why no browser can run. Exit 0 with a browser, 1 without (scripts/test.sh goes
# on; the browser test then fails with this line: nothing is skipped).
set -uo pipefail
me="scripts/install_chromium.sh"
NAMES=(chromium chromium-browser google-chrome google-chrome-stable)
named="chromium, chromium-browser, google-chrome or google-chrome-stable"

find_browser() {
    if [ -n "${KVCHECK_BROWSER:-}" ]; then
        command -v -- "$KVCHECK_BROWSER"
        return
    fi
    local name
    for name in "${NAMES[@]}"; do
        if command -v -- "$name"; then
            return 0
        fi
    done
    return 1
}

if browser=$(find_browser); then
    echo "$me: using the browser already installed: $browser"
    exit 0
fi
if [ -n "${KVCHECK_BROWSER:-}" ]; then
    echo "$me: KVCHECK_BROWSER=$KVCHECK_BROWSER is not an executable: the browser test cannot run"
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    as_root=(sudo -n)
else
    echo "$me: no $named on PATH, and this user cannot install one (not root, no" \
         "passwordless sudo): the browser test cannot run; install chromium or set KVCHECK_BROWSER"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$me: no $named on PATH, and no apt-get to install chromium with: the browser" \
         "test cannot run; install chromium or set KVCHECK_BROWSER"
    exit 1
fi
log=$(mktemp)
if "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 &&
   "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >>"$log" 2>&1 &&
   browser=$(find_browser); then
    rm -f "$log"
    echo "$me: installed Debian's chromium with apt-get${as_root[*]:+ (${as_root[*]})}: $browser"
    exit 0
fi
why=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-200)
rm -f "$log"
echo "$me: apt-get could not install chromium (${why:-no output}): the browser test cannot run"
exit 1
