"""Point the course at another copy of the repository (a fork):

    python scripts/set_repository.py https://github.com/you/simpmd

Replaces the address in the places that hold it: simpmd.course.REPOSITORY, the set-up
cell at the top of every notebook (which installs simpmd from there on Colab), and the
README's "Open in Colab" links and clone command. Run it from anywhere; commit what it changed.
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def github_path(url: str) -> str:
    return url.removeprefix("https://github.com/").removesuffix(".git")


def main(new: str) -> None:
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", new):
        sys.exit(f"expected an address like https://github.com/you/simpmd, got {new!r}")
    course = ROOT / "simpmd" / "course" / "__init__.py"
    text = course.read_text()
    old = re.search(r'^REPOSITORY = "([^"]+)"$', text, flags=re.M).group(1)
    course.write_text(text.replace(f'REPOSITORY = "{old}"', f'REPOSITORY = "{new}"'))
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(notebook.read_text())
        first = next(c for c in nb["cells"] if c["cell_type"] == "code")
        first["source"] = [line.replace(old, new) for line in first["source"]]
        notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = ROOT / "README.md"
    text = readme.read_text().replace(f"/github/{github_path(old)}/", f"/github/{github_path(new)}/")
    old_folder, new_folder = github_path(old).split("/")[-1], github_path(new).split("/")[-1]
    text = text.replace(f"git clone {old}\n  cd {old_folder}\n", f"git clone {new}\n  cd {new_folder}\n")
    readme.write_text(text)
    print(f"The course now installs from {new} (was {old}).")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
