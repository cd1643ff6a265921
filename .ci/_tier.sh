# shellcheck shell=bash
# What the tiers share (.ci/compat, .ci/consumers, .ci/mmengine source this file).
#
# A tier has three outcomes:
#   its tests ran      the exit status of pytest;
#   skipped            exit 0 and a line "TIER: skipped: WHY", ONLY when the package index
#                      cannot be reached: pip cannot connect to it, no index is configured
#                      (PIP_NO_INDEX), or it serves nothing at all under the tier's package
#                      names. Lacking a network never fails CI;
#   FAILED             exit 1 and a line "TIER: FAILED: WHY" for everything else that keeps
#                      the tests from running: no interpreter or virtualenv, a pin that the
#                      reachable index does not serve, an install that fails after the
#                      downloads worked, an environment that installed but does not import.
#
# Each tier keeps one virtualenv under ${FP16UTILS_VENV_CACHE:-~/.cache/fp16utils}. It
# is reused only when its stamp (the pins it was built with and the Python version) is
# the tier's current one AND .ci/_envcheck.py, run in it, imports what the tier needs at
# the versions pinned; otherwise it is built again from nothing. The stamp is written
# last, after that check passed, so a half-built environment is never reused.
#
# Environment: PYTHON (the interpreter the virtualenvs are made from; default python3),
# FP16UTILS_VENV_CACHE, and pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, ...).

TIER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The torch .ci/run installs; the consumer and MMEngine tiers pin the same one.
TIER_TORCH=2.13.0
# What the project and its test extra need next to torch (setup.py), pinned.
TIER_PROJECT_PINS=(numpy==2.4.6 packaging==26.2 pytest==9.0.3 hypothesis==6.155.2)

# tier_init NAME: the interpreter, the cache, a scratch folder removed on exit.
tier_init() {
    TIER=$1
    TIER_PY=${PYTHON:-python3}
    TIER_CACHE=${FP16UTILS_VENV_CACHE:-$HOME/.cache/fp16utils}
    TIER_STARTED=$SECONDS
    mkdir -p "$TIER_CACHE" || tier_fail "cannot create the cache folder $TIER_CACHE"
    TIER_TMP=$(mktemp -d "${TMPDIR:-/tmp}/fp16utils-$TIER.XXXXXX") || tier_fail "no mktemp"
    trap 'rm -rf "$TIER_TMP"' EXIT
    command -v "$TIER_PY" >/dev/null 2>&1 || tier_fail "no interpreter '$TIER_PY' (set PYTHON)"
}

tier_say() { echo "$TIER: $*"; }

# tier_skip WHY / tier_fail WHY: print, let the tier add its own last line (tier_result,
# when defined), exit.
tier_skip() {
    echo "$TIER: skipped: $*"
    if declare -F tier_result >/dev/null; then tier_result skipped; fi
    exit 0
}
tier_fail() {
    echo "$TIER: FAILED: $*"
    if declare -F tier_result >/dev/null; then tier_result failed; fi
    exit 1
}

# tier_cannot_connect LOG: 0 when pip's log shows it could not talk to an index.
tier_cannot_connect() {
    grep -qiE 'NewConnectionError|ConnectTimeout|ReadTimeout|Read timed out|Max retries exceeded|Connection (refused|reset|aborted)|RemoteDisconnected|Temporary failure in name resolution|Name or service not known|nodename nor servname|Network is unreachable|No route to host|ProxyError|Cannot connect to proxy|Could not fetch URL|SSLError|IncompleteRead|HTTP error 5[0-9][0-9]|not a trusted or secure host' "$1"
}

# tier_served_nothing LOG: 0 when pip found no release at all under the name asked for
# (offline, PIP_NO_INDEX, an index without the package); a list of other versions means
# the index answered and the pin is wrong.
tier_served_nothing() {
    grep -qE '\(from versions: none\)|^ERROR: No matching distribution found for [^ =<>!~]+$' "$1"
}

# tier_last_error LOG: the line that says why (for the one-line reasons): pip's words
# about the connection when it could not connect, else the versions it found, else its
# last error line.
tier_last_error() {
    if tier_cannot_connect "$1"; then
        grep -oiE "Failed to establish a new connection: [^')\"]*|Temporary failure in name resolution|Name or service not known|Network is unreachable|No route to host|(Connect|Read)Timeout[A-Za-z]*|Read timed out|ProxyError[^')\"]*|Cannot connect to proxy|SSLError[^')\"]*|HTTP error 5[0-9][0-9][^'\"]*|Could not fetch URL [^ ]*|not a trusted or secure host" "$1" |
            tail -n 1 | cut -c1-200
        return
    fi
    { grep -E '\(from versions: ' "$1" || grep -E '^ERROR:' "$1" || grep -iE 'error' "$1" ||
        tail -n 1 "$1"; } 2>/dev/null |
        tail -n 1 | cut -c1-300
}

# tier_probe_pip: the pip to ask the index with before a virtualenv exists (the base
# interpreter's; the virtualenv's when the base has none).
tier_probe_pip() {
    if "$TIER_PY" -c "import pip" >/dev/null 2>&1; then
        echo "$TIER_PY"
    elif [ -x "${VENV:-}/bin/python" ] && "$VENV/bin/python" -c "import pip" >/dev/null 2>&1; then
        echo "$VENV/bin/python"
    else
        return 1
    fi
}

# tier_probe SPEC...: can the index serve these pins? Downloads them (--no-deps, a few
# hundred kB: choose small ones) with short timeouts. Returns 0 (yes), 2 (the index
# cannot be reached: the reason is in $TIER_PROBE_WHY), 1 (it answered, but does not
# serve a pin: the reason is in $TIER_PROBE_WHY). A tier may replace it by defining
# its own tier_probe after sourcing this file (compat does).
tier_probe() {
    local py log="$TIER_TMP/probe.log"
    py=$(tier_probe_pip) || { TIER_PROBE_WHY="no pip to reach the index with"; return 1; }
    rm -rf "$TIER_TMP/probe"
    if "$py" -m pip download --disable-pip-version-check --no-deps --no-cache-dir \
            --retries 1 --timeout 20 -d "$TIER_TMP/probe" "$@" >"$log" 2>&1; then
        return 0
    fi
    TIER_PROBE_WHY=$(tier_last_error "$log")
    if tier_cannot_connect "$log" || tier_served_nothing "$log"; then
        return 2
    fi
    return 1
}

# tier_require_index SPEC...: tier_probe, then skip (unreachable) or fail (bad pin).
tier_require_index() {
    local status=0
    tier_probe "$@" || status=$?
    case $status in
        0) return 0 ;;
        2) tier_skip "the package index cannot be reached, so $* cannot be installed" \
                     "(${TIER_PROBE_WHY:-pip said nothing})" ;;
        *) tier_fail "the package index answered but does not serve $*" \
                     "(${TIER_PROBE_WHY:-pip said nothing}): a pin to fix" ;;
    esac
}

# tier_pip LOG ARGS...: `pip install ARGS` in the tier's virtualenv, output appended to
# LOG; a failure goes to tier_pip_failed.
tier_pip() {
    local log=$1 step="$TIER_TMP/step.log"
    shift
    "$VENV/bin/python" -m pip install --disable-pip-version-check "$@" >"$step" 2>&1
    local status=$?
    cat "$step" >>"$log"
    [ $status -eq 0 ] || tier_pip_failed "$step" "pip install $* failed in $VENV (log: $log)"
}

# tier_pip_failed LOG WHAT: after a failed pip command, skip the tier when pip could not
# download (its log says it could not connect, or it found nothing at all and the probe
# of $TIER_PROBE_SPECS now fails to reach the index), fail it with WHAT otherwise.
tier_pip_failed() {
    local log=$1 what=$2 probed=0
    tail -n 15 "$log"
    if tier_cannot_connect "$log"; then
        tier_skip "the package index could not be reached while installing" \
                  "($(tier_last_error "$log"))"
    fi
    if tier_served_nothing "$log"; then
        tier_probe "${TIER_PROBE_SPECS[@]}" || probed=$?
        [ $probed -eq 2 ] && tier_skip "the package index cannot be reached" \
                                       "(${TIER_PROBE_WHY:-pip said nothing})"
    fi
    tier_fail "$what"
}

# tier_stamp: what the environment is built from; a change rebuilds it.
tier_stamp() {
    printf '%s\n' "layout 2" "python $("$TIER_PY" -c 'import platform; print(platform.python_version())' 2>/dev/null)" "$@"
}

# tier_check [--quiet] ARGS...: .ci/_envcheck.py ARGS in the tier's virtualenv.
tier_check() {
    local out
    [ -x "$VENV/bin/python" ] || { TIER_CHECK_WHY="$VENV/bin/python does not exist"; return 1; }
    if out=$(PYTHONNOUSERSITE=1 "$VENV/bin/python" "$TIER_ROOT/.ci/_envcheck.py" \
                 --root "$TIER_ROOT" "$@" 2>&1); then
        return 0
    fi
    TIER_CHECK_WHY=$(echo "$out" | tail -n 1 | cut -c1-300)
    [ -n "$TIER_CHECK_WHY" ] || TIER_CHECK_WHY="its interpreter does not run"
    return 1
}

# tier_ready STAMP CHECK_ARGS...: 0 when $VENV holds that stamp and passes the check
# (why not: $TIER_READY_WHY).
tier_ready() {
    local stamp=$1
    shift
    if [ ! -e "$VENV/.fp16utils-tier" ]; then
        TIER_READY_WHY="no finished environment in $VENV"
        return 1
    fi
    if ! tier_check "$@"; then
        TIER_READY_WHY="$VENV no longer imports what the tier needs: $TIER_CHECK_WHY"
        return 1
    fi
    if [ "$(cat "$VENV/.fp16utils-tier" 2>/dev/null)" != "$stamp" ]; then
        TIER_READY_WHY="$VENV was built with other pins"
        return 1
    fi
    return 0
}

# tier_new_venv: an empty virtualenv at $VENV (what was there is removed).
tier_new_venv() {
    local entry
    if [ -e "$VENV" ] && [ ! -d "$VENV" ]; then
        tier_fail "$VENV is a file, not a virtualenv: remove it or set FP16UTILS_VENV_CACHE"
    fi
    # Never remove a folder that holds more than a (possibly half-removed) virtualenv.
    # .fp16utils-* are the markers these scripts write (older layouts named them per
    # tier, e.g. .fp16utils-consumers), so a cache from an older checkout is rebuilt.
    for entry in "$VENV"/* "$VENV"/.[!.]*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        case ${entry##*/} in
            bin|include|lib|lib64|share|pyvenv.cfg|install.log|.fp16utils-*) ;;
            *) tier_fail "$VENV holds ${entry##*/}, so it is not only a virtualenv:" \
                         "remove it or set FP16UTILS_VENV_CACHE" ;;
        esac
    done
    rm -rf "$VENV"
    "$TIER_PY" -m venv "$VENV" >"$TIER_TMP/venv.log" 2>&1 || {
        cat "$TIER_TMP/venv.log"
        tier_fail "cannot create a virtualenv with $TIER_PY (python3-venv missing?)"
    }
}

# tier_lock: one run at a time per virtualenv (two CI jobs sharing a cache).
tier_lock() {
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$VENV.lock"
        flock -w 3600 9 || tier_fail "waited an hour for $VENV.lock"
    fi
}
