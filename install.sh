#!/usr/bin/env bash
# Install labq for development and testing.
#
#   ./install.sh            # from any directory, as root or as a normal user
#
# 1. system packages the test-suite needs (docker.io, busybox-static, iproute2, tmux, prometheus, and
#    slurm-wlm with munge for the Slurm export and runtime tests, slurmdbd with mariadb-server for Slurm's
#    accounting, sudo for a Slurm node's agent that is not root)
# 2. a Python >= 3.11 virtual environment in .venv with `pip install -e '.[test]'`
# 3. a check that `.venv/bin/labq --version` runs
#
# Safe to run again: what is already there is kept. Set LABQ_REINSTALL=1 to
# force the pip step even when pyproject.toml has not changed since the last run.
set -Eeuo pipefail

STEP="starting"
trap 'rc=$?; echo "install.sh: FAILED in step \"$STEP\" (exit status $rc)" >&2; exit $rc' ERR

say()  { echo "install.sh: $*"; }
warn() { echo "install.sh: WARNING: $*" >&2; }
die()  { echo "install.sh: FAILED in step \"$STEP\": $*" >&2; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
ROOT="$(pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.labq-install-stamp"
PIP_LOG="$VENV/labq-pip.log"
MIN_PY="3.11"
# A "compat" editable install is a .pth file naming this checkout (labq/__init__.py finds agent/, store/ and
# tui/ beside it): setuptools' default import hook would cost every Python start in the venv about 10 ms.
EDITABLE_MODE="compat"

SYSTEM_PACKAGES=(docker.io busybox-static iproute2 tmux prometheus slurm-wlm munge slurmdbd mariadb-server sudo)
DONE=()            # what this run changed, for the summary
PENDING_WARN=""    # a warning to repeat in the summary

say "working in $ROOT"

# --- helpers -----------------------------------------------------------------

# Prints the first python (>= 3.11) found, as its real executable path.
find_python() {
    local c exe
    for c in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python; do
        command -v "$c" >/dev/null 2>&1 || continue
        exe="$("$c" -c 'import sys
if sys.version_info >= (3, 11): print(sys.executable)' 2>/dev/null)" || continue
        if [ -n "$exe" ]; then
            echo "$exe"
            return 0
        fi
    done
    return 1
}

# Lists the pythons that were found but are too old, for the error message.
describe_pythons() {
    local c v
    for c in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python; do
        command -v "$c" >/dev/null 2>&1 || continue
        v="$("$c" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" || v="does not run"
        echo "    $(command -v "$c"): $v"
    done
}

# Debian ships ensurepip (needed by `python -m venv`) in python3.X-venv.
python_has_venv() {
    "$1" -c 'import venv, ensurepip' >/dev/null 2>&1
}

venv_pkg_for() {
    "$1" -c 'import sys; print("python%d.%d-venv" % sys.version_info[:2])'
}

is_installed() {
    local status
    status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
    [ "$status" = "install ok installed" ]
}

# Prints why .venv cannot be reused; prints nothing and succeeds if it can.
venv_problem() {
    local shebang
    if [ ! -x "$VENV/bin/python" ]; then
        echo "its bin/python is missing or not executable"; return 0
    fi
    if ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; then
        echo "its python does not run or is older than $MIN_PY"; return 0
    fi
    if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        echo "its pip does not work"; return 0
    fi
    if [ -f "$VENV/bin/pip" ]; then
        shebang="$(head -n 1 "$VENV/bin/pip" | sed -e 's/^#!//' -e 's/[[:space:]].*$//')"
        if [ ! "$(dirname "$shebang")" -ef "$VENV/bin" ]; then
            echo "it was created at another path ($shebang)"; return 0
        fi
    fi
    return 0
}

stamp_value() {
    { echo "$ROOT"; echo "editable_mode=$EDITABLE_MODE"; "$VENV/bin/python" -c 'import sys; print(sys.version)'; cat pyproject.toml; } \
        | sha256sum | cut -d' ' -f1
}

# --- 1. system packages ------------------------------------------------------

STEP="system packages"
say "checking system packages: ${SYSTEM_PACKAGES[*]}"
if ! command -v dpkg-query >/dev/null 2>&1; then
    warn "dpkg-query not found (not a Debian system?); make sure these are installed yourself: ${SYSTEM_PACKAGES[*]}"
    PENDING_WARN="could not check system packages (no dpkg): ${SYSTEM_PACKAGES[*]}"
else
    present=(); missing=()
    for p in "${SYSTEM_PACKAGES[@]}"; do
        if is_installed "$p"; then present+=("$p"); else missing+=("$p"); fi
    done

    # On a fresh Debian, python3 may lack the venv module, or be missing.
    if PY="$(find_python)"; then
        if ! python_has_venv "$PY" && [[ "$PY" == /usr/bin/* || "$PY" == /bin/* ]]; then
            venv_pkg="$(venv_pkg_for "$PY")"
            is_installed "$venv_pkg" || missing+=("$venv_pkg")
        fi
    else
        missing+=(python3 python3-venv)
    fi

    [ ${#present[@]} -gt 0 ] && say "already present: ${present[*]}"
    if [ ${#missing[@]} -eq 0 ]; then
        say "all system packages already present"
    else
        say "missing: ${missing[*]}"
        SUDO=()
        if ! command -v apt-get >/dev/null 2>&1; then
            SUDO=(none)
        elif [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
                SUDO=(sudo -n)
            else
                SUDO=(none)
            fi
        fi
        if [ "${SUDO[*]-}" = "none" ]; then
            cmd="sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
            warn "not root and no password-less sudo (or no apt-get), so these system packages are NOT installed: ${missing[*]}"
            warn "install them with (or the same without sudo, as root):"
            warn "    $cmd"
            if [[ " ${missing[*]} " == *" docker.io "* ]]; then
                warn "continuing; tests that need docker will start dockerd themselves or be skipped"
            else
                warn "continuing without them"
            fi
            PENDING_WARN="system packages still missing: ${missing[*]} -- run: $cmd"
        else
            say "running ${SUDO[*]:+${SUDO[*]} }apt-get update"
            "${SUDO[@]}" apt-get update -q
            say "installing ${missing[*]} with apt-get"
            "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q --no-install-recommends "${missing[@]}"
            for p in "${missing[@]}"; do
                is_installed "$p" || die "apt-get finished but $p is still not installed"
            done
            say "installed: ${missing[*]}"
            DONE+=("installed system packages: ${missing[*]}")
            # the tests start their own Prometheus; the service Debian's package starts (on :9090) is not
            # wanted on a workstation that only installed it for them
            # likewise Slurm's, munge's and MariaDB's: the tests start a Slurm of their own, with its own munge key
            # and socket, and its own slurmdbd on a MariaDB of its own
            for service in prometheus slurmctld slurmd munge slurmdbd mariadb; do
                package="$service"
                case "$service" in slurmctld|slurmd) package=slurm-wlm ;; mariadb) package=mariadb-server ;; esac
                if [[ " ${missing[*]} " == *" $package "* ]] && command -v systemctl >/dev/null 2>&1 \
                        && systemctl is-enabled "$service" >/dev/null 2>&1; then
                    "${SUDO[@]}" systemctl disable --now "$service" >/dev/null 2>&1 \
                        && say "stopped and disabled the $service service the package started (the tests run their own)"
                fi
            done
        fi
    fi
fi

# --- 2. python and the virtual environment -----------------------------------

STEP="find python >= $MIN_PY"
say "looking for python >= $MIN_PY"
if ! PY="$(find_python)"; then
    found="$(describe_pythons)"
    die "no python >= $MIN_PY found on PATH.
${found:+  found:
$found
}  On Debian/Ubuntu: apt-get install python3 python3-venv   (Debian 12 ships 3.11)
  Or point PYTHON at one: PYTHON=/path/to/python3.11 ./install.sh"
fi
say "using $PY ($("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])'))"

STEP="create virtual environment"
if [ -e "$VENV" ]; then
    problem="$(venv_problem)"
    if [ -z "$problem" ]; then
        say "reusing existing virtual environment $VENV"
    else
        say "existing $VENV is broken ($problem); recreating it"
        rm -rf "$VENV"
        DONE+=("recreated broken .venv ($problem)")
    fi
fi
if [ ! -e "$VENV" ]; then
    if ! python_has_venv "$PY"; then
        die "$PY cannot create virtual environments (no venv/ensurepip module).
  On Debian/Ubuntu install it with: apt-get install python3-venv   (for this python: $(venv_pkg_for "$PY"))"
    fi
    say "creating virtual environment $VENV"
    if ! out="$("$PY" -m venv "$VENV" 2>&1)"; then
        rm -rf "$VENV"
        die "'$PY -m venv $VENV' failed:
$out
  On Debian/Ubuntu you may need: apt-get install python3-venv"
    fi
    [ -z "$(venv_problem)" ] || { rm -rf "$VENV"; die "the new virtual environment does not work: $(venv_problem)"; }
    [[ " ${DONE[*]-} " == *"recreated"* ]] || DONE+=("created .venv")
fi

STEP="pip install -e .[test]"
if [ "${LABQ_REINSTALL:-0}" = "0" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_value)" ] \
    && "$VENV/bin/python" -c 'import labq, os, sys; sys.exit(0 if os.path.samefile(os.path.dirname(labq.__file__), sys.argv[1]) else 1)' "$ROOT/labq" >/dev/null 2>&1; then
    say "python packages already installed (pyproject.toml unchanged since last run); skipping pip (LABQ_REINSTALL=1 forces it)"
else
    rm -f "$STAMP"
    say "upgrading pip in the virtual environment"
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >"$PIP_LOG" 2>&1; then
        tail -n 40 "$PIP_LOG" >&2
        die "could not upgrade pip (full log: $PIP_LOG)"
    fi
    say "installing labq and its test dependencies: pip install -e '.[test]' (log: $PIP_LOG)"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check \
            --config-settings "editable_mode=$EDITABLE_MODE" -e '.[test]' >"$PIP_LOG" 2>&1; then
        echo "----- last lines of $PIP_LOG -----" >&2
        tail -n 60 "$PIP_LOG" >&2
        echo "-----" >&2
        die "pip install -e '.[test]' failed (full log: $PIP_LOG)"
    fi
    stamp_value >"$STAMP"
    DONE+=("installed labq (editable) and test dependencies into .venv")
fi

# --- 3. verify ---------------------------------------------------------------

STEP="compile the sources"
# pip compiles what it installs, but an editable install runs from this tree, and with
# PYTHONDONTWRITEBYTECODE set Python never caches it: every labq command would recompile
# (about 45 ms). compileall only rewrites what changed; Python still reads these caches.
say "compiling labq's sources to bytecode (a faster start for every labq command)"
"$VENV/bin/python" -m compileall -q -j 0 labq agent store tui >/dev/null

STEP="verify: .venv/bin/labq --version"
say "checking that .venv/bin/labq --version runs"
if ! version="$("$VENV/bin/labq" --version 2>&1)"; then
    echo "$version" >&2
    die ".venv/bin/labq --version failed"
fi
say "labq --version: $version"

# --- summary -----------------------------------------------------------------

STEP="summary"
echo
say "done."
if [ ${#DONE[@]} -eq 0 ] && [ -z "$PENDING_WARN" ]; then
    say "  nothing to do: everything was already present"
elif [ ${#DONE[@]} -eq 0 ]; then
    say "  nothing changed"
else
    for d in "${DONE[@]}"; do say "  - $d"; done
fi
[ -z "$PENDING_WARN" ] || warn "$PENDING_WARN"
say "next:"
say "  .venv/bin/labq --help"
say "  .venv/bin/python -m pytest -n auto      # the test-suite"
