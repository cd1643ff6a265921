# shellcheck shell=bash
# The Chromium the docs tier's browser check drives (.ci/docs sources this after
# .ci/_tier.sh).
#
# tier_chromium DEFAULT: sets CHROMIUM to ${FP16UTILS_CHROMIUM:-DEFAULT} when that is a
# program. Where DEFAULT is missing and this runs as root with apt-get, `apt-get install
# chromium` (its log: $TIER_CACHE/$TIER-apt.log). When apt cannot reach its mirrors,
# sets BROWSER_SKIP to why (the browser check is skipped; the rest of the tier counts).
# Anything else fails the tier: FP16UTILS_CHROMIUM that is not a program, no way to
# install one (not root, no apt-get), an install that fails with the mirrors reached.
tier_chromium() {
    local default=$1 log="$TIER_CACHE/$TIER-apt.log"
    CHROMIUM=${FP16UTILS_CHROMIUM:-$default}
    BROWSER_SKIP=""
    [ -x "$CHROMIUM" ] && return 0
    [ -n "${FP16UTILS_CHROMIUM:-}" ] && tier_fail "FP16UTILS_CHROMIUM=$CHROMIUM is not a program"
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        tier_fail "no Chromium at $CHROMIUM, and it cannot be installed here (that needs" \
                  "root and apt-get): install chromium, or set FP16UTILS_CHROMIUM"
    fi
    tier_say "no Chromium at $CHROMIUM: apt-get install chromium (log: $log)"
    if DEBIAN_FRONTEND=noninteractive apt-get update >"$log" 2>&1 &&
       DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=300 \
           chromium >>"$log" 2>&1 && [ -x "$CHROMIUM" ]; then
        tier_say "installed $("$CHROMIUM" --version 2>/dev/null)"
        return 0
    fi
    # apt-get update only warns when it cannot fetch the lists; the install then fails.
    if grep -qiE 'Temporary failure resolving|Could not resolve|Unable to connect|Could not connect|Connection (failed|refused|timed out)|Network is unreachable|No route to host|Some index files failed to download' "$log"; then
        BROWSER_SKIP="apt-get could not reach its mirrors to install chromium ($(
            grep -m 1 -iE 'resolv|connect|unreachable|route' "$log" | sed 's/^ *//' |
            cut -c1-160))"
        return 0
    fi
    tail -n 15 "$log"
    tier_fail "apt-get install chromium failed (log: $log)"
}
