# Sourced by test.sh and course.sh (from the repository root); defines ensure_venv.
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
