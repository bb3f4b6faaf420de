#!/usr/bin/env bash
# Set up simpmd and run the whole course headless:  bash course.sh [--inplace]
# Or set up and open lesson 1 in JupyterLab, running nothing:  bash course.sh --open
# Or build the course as a website in site/, running nothing:  bash course.sh --site
#
# Needs Python 3.11 or newer (the lessons need a JAX that Python 3.10 cannot install;
# PYTHON=/path/to/python3.x chooses the interpreter). In order, it
#   1. creates .venv in this folder if needed and installs simpmd with its course and test
#      extras (JAX, matplotlib, JupyterLab, nbval); reinstalls only when pyproject.toml
#      or the package layout changed;
#   2. runs the tour, `python -m simpmd`: a small program on the simulated mesh and its trace;
#   3. executes every notebook in notebooks/ in a fresh kernel, writing the executed copies
#      to a temporary folder so that the repository stays as it was; with --inplace the
#      executed notebooks replace the ones in notebooks/;
#   4. regenerates the figures with `python -m simpmd.course.figures`, when that module exists.
# Steps 2-4 are skipped, with a message, while the part they run does not exist yet.
# Exits non-zero if any step failed; every notebook is run even when an earlier one fails.
# With --site it does none of that: it installs the site extra (Sphinx, myst-nb; docs/conf.py
# says how the site is made) and builds site/index.html (the README), one page per lesson
# from the committed notebooks with their stored outputs (none is executed), and docs/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

inplace=0
open=0
site=0
for arg in "$@"; do
    case "$arg" in
        --inplace) inplace=1 ;;
        --open) open=1 ;;
        --site) site=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "course.sh: unknown argument '$arg' (usage: bash course.sh [--inplace | --open | --site])" >&2; exit 2 ;;
    esac
done

# The lessons need Python 3.11 or newer: for 3.10, pip finds no JAX that runs them.
course_python=${PYTHON:-python3}
[[ -x "${SIMPMD_VENV:-.venv}/bin/python" ]] && course_python=${SIMPMD_VENV:-.venv}/bin/python
if ! "$course_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "The course needs Python 3.11 or newer, and '$course_python' is $("$course_python" --version 2>&1 | head -n 1)." >&2
    echo "Run with PYTHON=/path/to/python3.11 (or newer); remove ${SIMPMD_VENV:-.venv} first if an older Python made it." >&2
    exit 1
fi

# --- venv set-up: the same in test.sh and course.sh (a test checks) ---
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
# --- end of venv set-up ---

if ((site)); then
    ensure_venv site
    # -W --keep-going: a broken link or reference fails the build, after every page is listed;
    # -E reads every page again (an unchanged page would not repeat its warnings). Sphinx's
    # doctrees stay out of the site, in build/.
    start=$SECONDS
    "$VENV/bin/python" -m sphinx -b html -c docs -d build/site-doctrees -E -W --keep-going -q . site
    echo "course.sh: built the course's website in $((SECONDS - start)) s: open site/index.html"
    exit 0
fi

ensure_venv course test
py=$VENV/bin/python

if ((open)); then
    echo "Opening lesson 1 in JupyterLab; stop it with Ctrl-C here."
    exec "$VENV/bin/jupyter" lab notebooks/01_devices_and_meshes.ipynb
fi

# The notebooks and the figures run JAX on 8 fake CPU devices where no accelerator is present.
case " ${XLA_FLAGS:-} " in
    *" --xla_force_host_platform_device_count="*) ;;
    *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=8" ;;
esac

failed=()
ran=()      # what ran, for the closing line

echo
echo "== The tour: python -m simpmd"
if [[ -f simpmd/__main__.py ]]; then
    "$py" -m simpmd || failed+=("the tour (python -m simpmd)")
    ran+=("the tour")
else
    echo "skipped: simpmd/__main__.py does not exist yet"
fi

echo
echo "== The course: notebooks/*.ipynb"
shopt -s nullglob
notebooks=(notebooks/*.ipynb)
shopt -u nullglob
if ((${#notebooks[@]} == 0)); then
    echo "skipped: no notebooks in notebooks/ yet"
else
    if ((inplace)); then
        destination=(--inplace)
        echo "Executed notebooks replace the ones in notebooks/ (--inplace)"
    else
        outdir=$(mktemp -d "${TMPDIR:-/tmp}/simpmd-course.XXXXXX")
        destination=(--output-dir "$outdir")
        echo "Executed notebooks go to $outdir (pass --inplace to update notebooks/)"
    fi
    checks=$(mktemp -d "${TMPDIR:-/tmp}/simpmd-crosschecks.XXXXXX")
    sockets=$(mktemp -d "${TMPDIR:-/tmp}/simpmd-kernel.XXXXXX")
    for nb in "${notebooks[@]}"; do
        start=$SECONDS
        export SIMPMD_CROSSCHECK_LOG="$checks/$(basename "$nb" .ipynb).log"
        : > "$SIMPMD_CROSSCHECK_LOG"
        # IPC transport: the kernel talks to nbconvert over local sockets instead of TCP,
        # so it has no reason to warn about unencrypted TCP once per notebook. The socket
        # path must be absolute: the kernel runs in notebooks/, nbconvert here.
        if "$py" -m jupyter nbconvert --to notebook --execute --log-level=WARN \
                --KernelManager.transport=ipc --KernelManager.ip="$sockets/kernel" \
                --ExecutePreprocessor.timeout=600 "${destination[@]}" "$nb"; then
            echo "ok      $nb  ($((SECONDS - start)) s)"
        else
            echo "FAILED  $nb  ($((SECONDS - start)) s)"
            failed+=("$nb")
        fi
    done
    unset SIMPMD_CROSSCHECK_LOG
    rm -rf "$sockets"
    ran+=("${#notebooks[@]} notebooks")
    if ((inplace)); then
        # Execution timestamps would make every re-run a diff; they are not content.
        "$py" -c 'import json, sys
for p in sys.argv[1:]:
    nb = json.load(open(p))
    for c in nb["cells"]:
        c.get("metadata", {}).pop("execution", None)
    with open(p, "w") as f:
        json.dump(nb, f, indent=1, ensure_ascii=False)
        f.write("\n")' "${notebooks[@]}"
    fi
    echo
    echo "== Every cross-check of the course (simpmd vs real JAX)"
    for log in "$checks"/*.log; do
        total=$(wc -l < "$log")
        bad=$(grep -c '^NOT OK' "$log" || true)
        known=$(grep -c '^EXPLAINED' "$log" || true)
        if ((total == 0)); then
            echo "$(basename "$log" .log): no simpmd.crosscheck call; it compares with real JAX in cells of its own"
            continue
        fi
        echo "$(basename "$log" .log): $total cross-check(s), $((total - bad - known)) agree," \
             "$known differ for a known reason, $bad disagree"
        grep '^NOT OK\|^EXPLAINED' "$log" | sed 's/^/    /' || true
        if ((bad)); then failed+=("cross-checks in $(basename "$log" .log)"); fi
        crosschecks=$((${crosschecks:-0} + total))
    done
    ran+=("${crosschecks:-0} cross-checks against real JAX")
    echo "(one line per cross-check in $checks)"
fi

echo
echo "== The figures: python -m simpmd.course.figures"
if [[ -f simpmd/course/figures.py ]]; then
    "$py" -m simpmd.course.figures || failed+=("the figures (python -m simpmd.course.figures)")
    ran+=("the figures")
else
    echo "skipped: simpmd/course/figures.py does not exist"
fi

echo
if ((${#failed[@]})); then
    echo "course.sh: ${#failed[@]} step(s) failed:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
if ((${#ran[@]} == 0)); then
    echo "course.sh: nothing to run yet."
else
    summary=$(printf '%s, ' "${ran[@]}")
    echo "course.sh: ran without error: ${summary%, }."
fi
