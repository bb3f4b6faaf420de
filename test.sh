#!/usr/bin/env bash
# Run simpmd's tests:  bash test.sh [pytest arguments...]
#
# Needs only Python 3.10 or newer. On first use it creates .venv in this folder and
# installs simpmd with its test extra (pytest, hypothesis, nbval, JAX, matplotlib);
# later runs reinstall only when pyproject.toml or the package layout has changed. JAX is given 8 fake CPU
# devices, so the cross-checks against jax.pmap run on any machine. The exit code is
# pytest's: 0 when every test passed, non-zero otherwise (5 when no test was collected).
# Set PYTHON to choose the interpreter that creates .venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# --- venv set-up: the same function is in test.sh and course.sh (a test checks) ---
# ensure_venv EXTRA...: create .venv if needed and install simpmd with these extras,
# unless each of them was already installed from this same pyproject.toml and package
# layout. A stamp file per extra in .venv holds a hash of both. (The layout counts because
# an editable install records which folders are packages: one made before
# simpmd/__init__.py existed would import simpmd as an empty namespace package.)
ensure_venv() {
    local py=.venv/bin/python base=${PYTHON:-python3}
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
            echo "simpmd needs Python 3.10 or newer, and '$base' is $("$base" --version 2>&1)." >&2
            echo "Run with PYTHON=/path/to/python3.x to choose another interpreter." >&2
            exit 1
        fi
        echo "Creating .venv with $("$base" --version 2>&1)"
        rm -rf .venv
        "$base" -m venv .venv
    fi
    local hash extra missing=0
    hash=$("$py" -c 'import hashlib, pathlib
h = hashlib.sha256(pathlib.Path("pyproject.toml").read_bytes())
for init in sorted(pathlib.Path("simpmd").glob("**/__init__.py")):
    h.update(init.as_posix().encode())
print(h.hexdigest())')
    for extra in "$@"; do
        [[ "$(cat ".venv/.simpmd-$extra.stamp" 2>/dev/null)" == "$hash" ]] || missing=1
    done
    if ((missing)); then
        local spec start=$SECONDS
        spec=".[$(IFS=,; echo "$*")]"
        echo "Installing simpmd$spec into .venv (the first time downloads JAX, about 600 MB)"
        "$py" -m pip install --quiet --disable-pip-version-check --editable "$spec"
        for extra in "$@"; do echo "$hash" > ".venv/.simpmd-$extra.stamp"; done
        echo "Installed in $((SECONDS - start)) s"
    fi
}
# --- end of venv set-up ---

ensure_venv test

# JAX reads this flag once, when its CPU backend starts; tests/conftest.py sets it too.
case " ${XLA_FLAGS:-} " in
    *" --xla_force_host_platform_device_count="*) ;;
    *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=8" ;;
esac

# The notebooks run under nbval with JAX's DeprecationWarnings raised as errors (see
# simpmd.course.start), so the day JAX deprecates an API the course uses, CI says so.
export SIMPMD_STRICT_DEPRECATIONS=1

exec .venv/bin/python -m pytest "$@"
