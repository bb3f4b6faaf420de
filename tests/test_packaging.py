"""The project's front door stays consistent: pyproject.toml and environment.yml install the
same things, the README gives the commands that the scripts and CI really run, and the
README's first example works."""
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------- reading the two files

def load_pyproject() -> dict:
    try:
        import tomllib                               # Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib                  # the same parser, before 3.11
        except ImportError:
            try:
                from pip._vendor import tomli as tomllib  # pip ships one in every venv
            except ImportError:
                pytest.skip("no TOML parser: needs Python 3.11+, tomli, or pip")
    return tomllib.loads(read("pyproject.toml"))


_KEY = re.compile(r"^([A-Za-z_][\w.-]*):(?:\s+(.*))?$")


def parse_simple_yaml(text: str):
    """Parse the small block-style YAML subset that environment.yml uses: mappings of
    `key: scalar` or `key:` + nested block, sequences of `- scalar` or `- key: ...`, and
    comments. Anything else (flow style, anchors, multi-line strings) raises ValueError,
    so that the file cannot drift out of what this reader (and the test) understands."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        content = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not content.strip():
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError(f"environment.yml:{number}: tabs in indentation")
        indent = len(content) - len(content.lstrip())
        content = content.strip()
        # "- key: value" opens a mapping inside a sequence item: split it into the item
        # marker and the mapping's first line, two columns further in.
        if content.startswith("- ") and _KEY.match(content[2:].strip()):
            lines.append((indent, "-", number))
            lines.append((indent + 2, content[2:].strip(), number))
        else:
            lines.append((indent, content, number))

    def scalar(value: str, number: int):
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            return value[1:-1]
        if value[0] in "[{&*|>!'\"%@`":
            raise ValueError(f"environment.yml:{number}: unsupported YAML: {value!r}")
        return value

    def block(i: int, indent: int):
        """Parse the block whose lines start at column `indent`, from line i."""
        is_sequence = lines[i][1] == "-" or lines[i][1].startswith("- ")
        node = [] if is_sequence else {}
        while i < len(lines) and lines[i][0] >= indent:
            col, content, number = lines[i]
            if col > indent:
                raise ValueError(f"environment.yml:{number}: unexpected indentation")
            if is_sequence:
                if not (content == "-" or content.startswith("- ")):
                    raise ValueError(f"environment.yml:{number}: expected '- item'")
                if content == "-":
                    if i + 1 >= len(lines) or lines[i + 1][0] <= indent:
                        raise ValueError(f"environment.yml:{number}: empty sequence item")
                    child, i = block(i + 1, lines[i + 1][0])
                    node.append(child)
                    continue
                node.append(scalar(content[2:], number))
                i += 1
            else:
                match = _KEY.match(content)
                if not match:
                    raise ValueError(f"environment.yml:{number}: expected 'key: value'")
                key, value = match.group(1), match.group(2)
                if value:
                    node[key] = scalar(value, number)
                    i += 1
                elif i + 1 < len(lines) and lines[i + 1][0] > indent:
                    node[key], i = block(i + 1, lines[i + 1][0])
                elif (i + 1 < len(lines) and lines[i + 1][0] == indent
                      and lines[i + 1][1].startswith("-")):
                    # YAML allows a sequence at the same column as its key.
                    node[key], i = block(i + 1, indent)
                else:
                    node[key] = None
                    i += 1
        return node, i

    if not lines:
        return None
    node, i = block(0, lines[0][0])
    if i != len(lines):
        raise ValueError(f"environment.yml:{lines[i][2]}: unexpected dedent")
    return node


def test_simple_yaml_reader_on_a_known_example():
    text = """
name: demo   # a comment
channels:
  - conda-forge
dependencies:
  - numpy>=1.24
  - pip
  - pip:
      - jax>=0.4.30
      - "-e ."
other:
- same-column item
"""
    assert parse_simple_yaml(text) == {
        "name": "demo",
        "channels": ["conda-forge"],
        "dependencies": ["numpy>=1.24", "pip", {"pip": ["jax>=0.4.30", "-e ."]}],
        "other": ["same-column item"],
    }
    with pytest.raises(ValueError):
        parse_simple_yaml("dependencies: [numpy, jax]\n")


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;#]*)")


def split_requirement(requirement: str) -> tuple[str, str]:
    """'jax[cpu] >= 0.4.30; python_version>"3"' -> ('jax', '>=0.4.30'): the distribution
    name normalised as pip does (PEP 503), and the version constraint without spaces."""
    match = _NAME.match(requirement)
    assert match, f"cannot read the requirement {requirement!r}"
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return name, re.sub(r"\s+", "", match.group(2))


def pyproject_requirements() -> dict[str, set[str]]:
    """Every distribution pyproject.toml names (dependencies and all extras), with the
    version constraints it gives for it."""
    project = load_pyproject()["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    found: dict[str, set[str]] = {}
    for requirement in requirements:
        name, constraint = split_requirement(requirement)
        if name != "simpmd":                         # an extra may pull in another extra
            found.setdefault(name, set()).add(constraint)
    return found


def environment_requirements() -> dict[str, set[str]]:
    """Every distribution environment.yml installs (conda and pip), without python, pip
    and the local install of simpmd itself."""
    environment = parse_simple_yaml(read("environment.yml"))
    found: dict[str, set[str]] = {}
    for entry in environment["dependencies"]:
        items = entry["pip"] if isinstance(entry, dict) else [entry]
        for item in items:
            if item.startswith(("-", ".")):
                continue                             # "-e ." installs simpmd itself
            name, constraint = split_requirement(item)
            if name not in ("python", "pip"):
                found.setdefault(name, set()).add(constraint)
    return found


# ---------------------------------------------------------------- the tests

def test_the_engine_needs_only_numpy():
    names = [split_requirement(r)[0] for r in load_pyproject()["project"]["dependencies"]]
    assert names == ["numpy"]


def test_pyproject_and_environment_yml_name_the_same_distributions():
    in_pyproject = set(pyproject_requirements())
    in_environment = set(environment_requirements())
    assert in_pyproject == in_environment, (
        f"only in pyproject.toml: {sorted(in_pyproject - in_environment)}; "
        f"only in environment.yml: {sorted(in_environment - in_pyproject)}")


def test_pyproject_and_environment_yml_ask_for_the_same_versions():
    in_pyproject = pyproject_requirements()
    in_environment = environment_requirements()
    for name, constraints in in_pyproject.items():
        assert len(constraints) == 1, f"pyproject.toml asks for {name} {sorted(constraints)}"
        assert in_environment.get(name) == constraints, (
            f"{name}: pyproject.toml says {sorted(constraints)}, "
            f"environment.yml says {sorted(in_environment.get(name, []))}")


def test_environment_yml_installs_simpmd_itself():
    environment = parse_simple_yaml(read("environment.yml"))
    pip_items = [item for entry in environment["dependencies"] if isinstance(entry, dict)
                 for item in entry.get("pip", [])]
    assert "-e ." in pip_items


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```([\w+-]*)\n(.*?)^```", markdown, flags=re.M | re.S)


def test_readme_gives_the_two_commands_as_the_scripts_are_run():
    command_lines = {line.split("#")[0].strip()
                     for _, body in code_blocks(read("README.md")) for line in body.splitlines()}
    for command in ("bash course.sh", "bash test.sh"):
        assert command in command_lines, f"README.md has no code line `{command}`"
        script = ROOT / command.split()[1]
        assert script.is_file(), f"README.md gives `{command}`, but {script.name} is missing"


def test_ci_runs_the_readme_test_command():
    ci = read(".ci/run")
    assert ci.startswith("#!/usr/bin/env bash") or ci.startswith("#!/bin/bash")
    assert "set -euo pipefail" in ci
    commands = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert "bash scripts/test_matrix.sh" in commands, \
        ".ci/run must run the JAX version matrix, scripts/test_matrix.sh"
    matrix = read("scripts/test_matrix.sh")
    assert re.search(r'^\s+if .*bash test\.sh "\$\{args\[@\]\}"', matrix, flags=re.M), \
        "each leg of the matrix must run the README's test command, `bash test.sh`"
    for leg in ("3.13:0.7.2", "3.11:0.10.2", "3.12:0.12.0.1", "3.10:none"):
        assert leg in matrix, f"the matrix has no leg {leg}"


def test_matrix_skips_a_missing_interpreter_out_loud_and_fails_when_nothing_ran(tmp_path):
    """A leg whose Python is not installed is skipped with a message, never silently; a
    run in which no leg could run fails."""
    env = {**os.environ, "SIMPMD_MATRIX": "3.99:0.7.2", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "test_matrix.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "SKIPPED: no Python 3.99 interpreter" in run.stdout
    assert "no leg ran" in run.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("script", ["test.sh", "course.sh", ".ci/run", "scripts/test_matrix.sh"])
def test_scripts_are_valid_bash(script):
    result = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_two_scripts_set_up_the_venv_the_same_way():
    def venv_setup(script):
        text = read(script)
        start = text.index("# --- venv set-up")
        return text[start:text.index("# --- end of venv set-up ---", start)]
    assert venv_setup("test.sh") == venv_setup("course.sh"), \
        "the ensure_venv function differs between test.sh and course.sh: keep them identical"


def test_the_venv_without_jax_takes_its_packages_from_pyproject():
    """SIMPMD_JAX=none installs the extras minus JAX by reading them from simpmd's metadata
    (built from pyproject.toml), rather than from a second copy of the list."""
    script = read("scripts/ensure_venv.sh")
    assert 'importlib.metadata.requires("simpmd")' in script
    for extra in load_pyproject()["project"]["optional-dependencies"].values():
        for requirement in extra:
            name, constraint = split_requirement(requirement)
            assert not re.search(rf"{re.escape(name)}\s*{re.escape(constraint)}", script), (
                f"scripts/ensure_venv.sh lists {requirement!r} itself: derive it from "
                "pyproject.toml")


def test_gitignore_keeps_the_venv_and_build_outputs_out_of_git():
    ignored = set(read(".gitignore").split())
    # ".venv" without a slash: a .venv that is a symlink to a versioned venv is a file
    for pattern in (".venv", "__pycache__/", "*.egg-info/", ".pytest_cache/", ".hypothesis/",
                    ".ipynb_checkpoints/"):
        assert pattern in ignored


def test_this_session_gives_jax_8_fake_cpu_devices():
    assert "--xla_force_host_platform_device_count=" in os.environ.get("XLA_FLAGS", "")


def test_readme_quick_look_runs_and_prints_what_it_says():
    """The README's first example is run as written; its first printed line must be the
    one the README shows in a comment."""
    readme = read("README.md")
    section = readme[readme.index("## Quick look"):]
    language, example = code_blocks(section)[0]
    assert language == "python"
    promised = re.search(r"print\(np\.asarray\(out\)\)\s*#\s*(\[.*\])", example).group(1)
    result = subprocess.run([sys.executable, "-c", example], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == promised
    assert len(result.stdout.splitlines()) > 1, "print(f.trace) printed nothing"
    # the comment on print(f.trace) names rows the printed trace has, and no others
    comment = re.search(r"print\(f\.trace\)\s*#(.*)", example).group(1)
    assert "computed" not in comment
    for row in ("receive x[3]", "psum('devices')", "return out[3]"):
        assert row in result.stdout, row


def test_readme_opens_with_the_learners_path():
    """What a learner needs comes first: what they will be able to do, what to know and
    have (Python 3.11+), how long it takes, and how to open lesson 1; the engine's
    internals, benchmarks and test matrix live in docs/, linked from the README."""
    readme = read("README.md")
    heads = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert heads[:3] == ["What you will be able to do", "Before you start", "Open lesson 1"], heads
    assert "Python 3.11 or newer" in readme and "3.10 or newer" not in readme
    # why the course needs 3.11 while the engine and test.sh accept 3.10, said once
    before = readme[readme.index("## Before you start"):readme.index("## Open lesson 1")]
    assert "jaxlib" in before and "3.10" in before and readme.count("3.10") == before.count("3.10")
    opening = readme[readme.index("## Open lesson 1"):readme.index("## Two routes")]
    clone = opening.index("git clone https://github.com/")
    assert clone < opening.index("cd ") < opening.index("bash course.sh --open")
    assert "notebooks/01_devices_and_meshes.ipynb" in opening          # the Colab link
    for doc in ("docs/engine.md", "docs/benchmarks.md", "docs/testing.md"):
        assert f"]({doc})" in readme and (ROOT / doc).is_file(), doc
    assert "scripts/test_matrix.sh" in read("docs/testing.md")
    assert "scripts/set_repository.py" in read("docs/testing.md")
    assert "| 1024 |" in read("docs/benchmarks.md") and "| 1024 |" not in readme


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the course, and so course.sh, needs 3.11+")
def test_course_open_sets_up_and_opens_lesson_1_without_running_the_course(tmp_path):
    """`bash course.sh --open` on a venv that is already set up: it execs JupyterLab on
    lesson 1 (a stand-in jupyter here) and runs no notebook, tour or figure."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    jupyter = venv / "bin" / "jupyter"
    jupyter.write_text('#!/usr/bin/env bash\necho "jupyter called with: $*"\n')
    jupyter.chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())   # ensure_venv's stamp
    for init in sorted((ROOT / "simpmd").glob("**/__init__.py")):
        digest.update(init.relative_to(ROOT).as_posix().encode())
    for extra in ("course", "test"):
        (venv / f".simpmd-{extra}.stamp").write_text(digest.hexdigest() + "\n")
    env = {**os.environ, "SIMPMD_VENV": str(venv), "SIMPMD_JAX": ""}
    run = subprocess.run(["bash", str(ROOT / "course.sh"), "--open"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "jupyter called with: lab notebooks/01_devices_and_meshes.ipynb" in run.stdout
    assert "Installing" not in run.stdout and "== The tour" not in run.stdout
