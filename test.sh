#!/usr/bin/env bash
# Run simpmd's tests:  bash test.sh [pytest arguments...]
#
# Needs Python 3.10 or newer. The lessons and every comparison with JAX need 3.11+ (the
# README's "Before you start" says why): on 3.10 those tests are skipped and the notebooks
# cannot run (scripts/test_matrix.sh leaves them out there). On first use it creates .venv
# in this folder and installs simpmd with its test and course extras (pytest, hypothesis,
# nbval, JAX, matplotlib, JupyterLab); later runs reinstall only when pyproject.toml or
# the package layout has changed. JAX is given 8 fake CPU devices (on a machine with one GPU or TPU
# core, the CPU becomes JAX's default backend, see tests/conftest.py), so the cross-checks
# against jax.pmap run on any machine. The exit code is pytest's: 0 when every test
# passed, non-zero otherwise (5 when no test was collected). PYTHON chooses the interpreter
# that creates the venv; SIMPMD_VENV and SIMPMD_JAX choose the venv and a JAX version
# (scripts/ensure_venv.sh; scripts/test_matrix.sh runs this script once per JAX version).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# --- venv set-up: the same in test.sh and course.sh (a test checks) ---
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
# --- end of venv set-up ---

ensure_venv test course

# JAX reads this flag once, when its CPU backend starts; tests/conftest.py sets it too.
case " ${XLA_FLAGS:-} " in
    *" --xla_force_host_platform_device_count="*) ;;
    *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=8" ;;
esac

# The notebooks run under nbval with JAX's DeprecationWarnings raised as errors (see
# simpmd.course.start), so the day JAX deprecates an API the course uses, CI says so.
export SIMPMD_STRICT_DEPRECATIONS=1

# One pytest worker per core (pytest-xdist), each notebook's cells on one worker (loadfile:
# nbval runs a notebook's cells in order in one kernel). Arguments that choose the workers
# themselves (-n, --numprocesses, -p no:xdist) or ask only to list the tests win.
parallel=(-n auto --dist loadfile)
for arg in "$@"; do
    case "$arg" in
        -n|-n*|--numprocesses*|no:xdist|--collect-only|--co) parallel=() ;;
    esac
done

exec "$VENV/bin/python" -m pytest "${parallel[@]}" "$@"
