# Sourced by test.sh and course.sh (from the repository root); defines ensure_venv.
# ensure_venv EXTRA...: create the venv if needed and install simpmd with these extras,
# unless each of them was already installed from this same pyproject.toml, package
# layout and JAX pin. A stamp file per extra in the venv holds a hash of all three. (The
# layout counts because an editable install records which folders are packages: one made
# before simpmd/__init__.py existed would import simpmd as an empty namespace package.)
#
# Three environment variables choose what is installed where (scripts/test_matrix.sh uses them):
#   PYTHON       the interpreter that creates the venv (default python3)
#   SIMPMD_VENV  the venv's folder (default .venv)
#   SIMPMD_JAX   a JAX version to pin jax and jaxlib to (e.g. 0.7.2); "none" installs the
#                extras without JAX (Python 3.10 has no jaxlib newer than 0.6, so there only
#                the engine runs);
#                unset: the newest JAX that pip finds for the interpreter.
VENV=${SIMPMD_VENV:-.venv}

ensure_venv() {
    local py=$VENV/bin/python base=${PYTHON:-python3} pin=${SIMPMD_JAX:-}
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
            echo "simpmd needs Python 3.10 or newer, and '$base' is $("$base" --version 2>&1)." >&2
            echo "Run with PYTHON=/path/to/python3.x to choose another interpreter." >&2
            exit 1
        fi
        echo "Creating $VENV with $("$base" --version 2>&1)"
        rm -rf "$VENV"
        "$base" -m venv "$VENV"
    fi
    local hash extra missing=0
    hash=$(SIMPMD_JAX="$pin" "$py" -c 'import hashlib, os, pathlib
h = hashlib.sha256(pathlib.Path("pyproject.toml").read_bytes())
for init in sorted(pathlib.Path("simpmd").glob("**/__init__.py")):
    h.update(init.as_posix().encode())
h.update(os.environ["SIMPMD_JAX"].encode())
print(h.hexdigest())')
    for extra in "$@"; do
        [[ "$(cat "$VENV/.simpmd-$extra.stamp" 2>/dev/null)" == "$hash" ]] || missing=1
    done
    if ((missing)); then
        local spec start=$SECONDS pins=()
        [[ -n "$pin" && "$pin" != none ]] && pins=("jax==$pin" "jaxlib==$pin")
        spec=".[$(IFS=,; echo "$*")]"
        if [[ "$pin" == none ]]; then
            echo "Installing simpmd$spec without JAX into $VENV"
            # The same extras without jax and jaxlib. Their packages are read from simpmd's
            # own metadata, which the editable install has just built from pyproject.toml,
            # so the list is written in one place (importlib.metadata: any Python >= 3.10).
            # Each line there reads `name>=version; [marker and ]extra == "name"`.
            "$py" -m pip install --quiet --disable-pip-version-check --editable .
            local listed requirements=()
            listed=$("$py" - "$@" <<'PY'
import importlib.metadata, re, sys
wanted = {}
for line in importlib.metadata.requires("simpmd") or []:
    spec, _, marker = (part.strip() for part in line.partition(";"))
    extra = re.fullmatch(r'(?:(.+) and )?extra == "([^"]+)"', marker)
    name = re.match(r"[A-Za-z0-9._-]+", spec).group().lower()
    if extra and extra.group(2) in sys.argv[1:] and name not in ("jax", "jaxlib"):
        wanted[f"{spec}; {extra.group(1)}" if extra.group(1) else spec] = True
print("\n".join(wanted))
PY
)
            if [[ -n "$listed" ]]; then
                mapfile -t requirements <<< "$listed"
                "$py" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
            fi
        else
            local note=" (the first time downloads JAX, about 600 MB)"
            [[ "$*" == site ]] && note=""       # the site extra alone has no JAX
            echo "Installing simpmd$spec${pin:+ with jax $pin} into $VENV$note"
            "$py" -m pip install --quiet --disable-pip-version-check --editable "$spec" "${pins[@]}"
        fi
        for extra in "$@"; do echo "$hash" > "$VENV/.simpmd-$extra.stamp"; done
        echo "Installed in $((SECONDS - start)) s"
    fi
}
