#!/usr/bin/env bash
# Run the README's test command (bash test.sh) once per supported JAX version:
#   bash scripts/test_matrix.sh [pytest arguments...]
#
# Each leg gets its own venv (.venv-jax<version>) made with its own interpreter:
#   jax 0.7.2     on Python 3.13  what Colab preinstalls (the oldest JAX supported)
#   jax 0.10.2    on Python 3.11  what `pip install jax` gives on Python 3.11
#   jax 0.11.2    on Python 3.12  what a GPU runtime shaped like Colab's had (the lent GPU)
#   jax 0.12.0.1  on Python 3.12  the newest (`pip install jax` on Python >= 3.12)
#   no jax        on Python 3.10  the engine alone (jaxlib stops at 0.6 on Python 3.10)
# Interpreters are looked up as pythonX.Y on PATH, then under pyenv
# ($(pyenv root)/versions/X.Y.*/bin, since pyenv's shims refuse versions not selected).
# A leg whose interpreter is missing is skipped with a message that says so; the run
# fails if any leg fails or if no leg ran. Set SIMPMD_MATRIX="3.13:0.7.2 3.12:0.12.0.1" to
# run only some legs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

legs=${SIMPMD_MATRIX:-"3.13:0.7.2 3.11:0.10.2 3.12:0.11.2 3.12:0.12.0.1 3.10:none"}

find_python() {
    local version=$1 candidate
    candidate=$(command -v "python$version" 2>/dev/null) &&
        "$candidate" -c 'import sys' 2>/dev/null && { echo "$candidate"; return; }
    local root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for candidate in "$root"/versions/"$version".*/bin/"python$version"; do
        [[ -x "$candidate" ]] && { echo "$candidate"; return; }
    done
    return 1
}

summary=() failed=0 ran=0
for leg in $legs; do
    version=${leg%%:*} jax=${leg#*:}
    label="Python $version, jax $jax"
    echo
    echo "==== $label"
    if ! python=$(find_python "$version"); then
        echo "SKIPPED: no Python $version interpreter on this machine (not on PATH, not under pyenv)"
        summary+=("SKIPPED  $label: no Python $version interpreter")
        continue
    fi
    args=("$@")
    # Without JAX the notebooks cannot run (their real-JAX half needs it): the engine's tests only.
    [[ "$jax" == none ]] && args+=("--ignore-glob=notebooks/*")
    start=$SECONDS
    if PYTHON="$python" SIMPMD_VENV=".venv-jax$jax" SIMPMD_JAX="$jax" bash test.sh "${args[@]}"; then
        summary+=("passed   $label ($((SECONDS - start)) s)")
    else
        summary+=("FAILED   $label ($((SECONDS - start)) s)")
        failed=1
    fi
    ran=$((ran + 1))
done

echo
echo "==== JAX version matrix"
printf '%s\n' "${summary[@]}"
if ((ran == 0)); then
    echo "test_matrix.sh: no leg ran (no interpreter found); nothing was tested." >&2
    exit 1
fi
exit $failed
