"""Sphinx's configuration for the course as a website: `bash course.sh --site` builds it into site/.

The source folder is the repository itself (README.md, notebooks/, docs/), so that every
relative link means on the site what it means on GitHub: `docs/engine.md` in the README
becomes docs/engine.html, `notebooks/01_devices_and_meshes.ipynb` becomes
notebooks/01_devices_and_meshes.html. The notebooks are shown with the outputs committed
with them and are never executed here. Nothing the pages load comes from another host:
the theme ships its fonts and icons, and math is turned into MathML at build time.

Sphinx with myst-nb and sphinx-book-theme is what JAX's own documentation is built with;
all of it installs from PyPI (the site extra) and builds offline. docs/testing.md says
more, and how tests/course/test_site.py reads the result in a real browser.
"""
import json
import pathlib
import re
import shutil
import sys

from docutils import nodes
from sphinx import addnodes

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from simpmd.course import REPOSITORY, colab_url  # noqa: E402  (the README's links come from it)

project = "simpmd"
html_title = "simpmd: SPMD the way JAX does it"
author = "the simpmd authors"
root_doc = "README"                      # the front page; copied to index.html once built
include_patterns = ["README.md", "notebooks/*.ipynb", "docs/*.md"]
exclude_patterns = ["site/**", ".venv*/**", "**/.ipynb_checkpoints"]

extensions = ["myst_nb"]
nb_execution_mode = "off"                # the committed outputs are what the site shows
nb_ipywidgets_js = {}                    # no widgets in the course; their loader is on a CDN
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3                 # `#a-heading` links, as GitHub makes them
html_math_renderer = "mathml"
suppress_warnings = ["misc.highlighting_failure"]   # tracebacks stored in outputs

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": REPOSITORY,
    "repository_branch": "main",
    "use_repository_button": True,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": False,        # each lesson's header links its notebook on GitHub
}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system says
html_favicon = "favicon.svg"             # else the browser asks for /favicon.ico, a 404
html_copy_source = False                 # the notebooks are on GitHub; the site is for reading

LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
DOCS = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))


def lesson_time(stem: str) -> str:
    """What the lesson's first cell says it takes ("about 25 minutes")."""
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
    top = "".join(cells[0]["source"])
    found = re.search(r"\*\*Time:\*\*\s*(about \d+ minutes)", top)
    return found.group(1) if found else "see the lesson's first cell"


def add_table_of_contents(app, docname, source):
    """Give the front page (the README, unchanged on disk) the site's navigation: the
    lessons in order, then the pages of docs/."""
    if docname != root_doc:
        return
    lessons = "\n".join(f"notebooks/{stem}" for stem in LESSONS)
    docs = "\n".join(f"docs/{stem}" for stem in DOCS)
    source[0] += (f"\n\n```{{toctree}}\n:hidden:\n:caption: Lessons\n\n{lessons}\n```\n"
                  f"\n```{{toctree}}\n:hidden:\n:caption: More\n\n{docs}\n```\n")


def add_lesson_header(app, pagename, templatename, context, doctree):
    """Put the lesson's time and a "run in Colab" link at the top of every lesson's page."""
    if not pagename.startswith("notebooks/") or "body" not in context:
        return
    stem = pagename.removeprefix("notebooks/")
    header = (f'<p class="simpmd-lesson-header"><strong>Time:</strong> {lesson_time(stem)}'
              f' &middot; <a class="simpmd-colab" href="{colab_url(stem + ".ipynb")}">'
              f'Run this lesson in Colab</a> &middot; <a href="{REPOSITORY}/blob/main/'
              f'notebooks/{stem}.ipynb">the notebook on GitHub</a></p>\n')
    context["body"] = header + context["body"]


def link_repository_files(app, doctree):
    """A link to a file of the repository that is not a page of the site (a script, a
    test) goes to that file on GitHub, rather than to a copy of it to download."""
    folder = pathlib.Path(doctree["source"]).parent
    for link in list(doctree.findall(addnodes.download_reference)):
        path = (folder / link["reftarget"]).resolve()
        if path.is_file() and path.is_relative_to(ROOT):
            relative = path.relative_to(ROOT).as_posix()
            link.replace_self(nodes.reference("", "", *link.children,
                                              refuri=f"{REPOSITORY}/blob/main/{relative}"))
            for key in (relative, pathlib.Path(relative)):     # no copy in _downloads/
                app.env.dlfiles.pop(key, None)                  # (Sphinx 9 keys by Path)


REMOTE_STYLESHEET = re.compile(r"<link\b[^>]*\bhref=[\"']?(?:https?:)?//[^>]*>", re.I)


def drop_remote_stylesheets(app, doctree, docname):
    """Stored HTML outputs may link a stylesheet on a CDN (matplotlib's animations link
    Font Awesome 4 for their buttons): the site must load nothing from another host, and
    the theme's own Font Awesome draws those icons."""
    for raw in doctree.findall(nodes.raw):
        if "html" in raw.get("format", "").split() and REMOTE_STYLESHEET.search(raw.astext()):
            raw.children = [nodes.Text(REMOTE_STYLESHEET.sub("", raw.astext()))]


def mathml(latex: str, display: str) -> str:
    """The formula as MathML, which browsers draw themselves: no MathJax to load."""
    from latex2mathml.converter import convert
    return convert(latex, display=display)


def visit_inline_math(self, node):
    self.body.append(mathml(node.astext(), "inline"))
    raise nodes.SkipNode


def visit_display_math(self, node):
    self.body.append(f'<div class="math">{mathml(node.astext(), "block")}</div>')
    raise nodes.SkipNode


def keep_outputs_out_of_the_repository(app):
    """myst-nb writes the notebooks' images beside the output folder, which for site/ is
    the repository's root: they go under build/ instead, which git ignores."""
    app.env.mystnb_config = app.env.mystnb_config.copy(
        output_folder=str(ROOT / "build" / "site-outputs"))


def copy_front_page(app, exception):
    """The README's page is also the site's index.html (same folder, so its links hold)."""
    if exception is None and app.builder.format == "html":
        out = pathlib.Path(app.outdir)
        shutil.copyfile(out / f"{root_doc}.html", out / "index.html")


def setup(app):
    app.add_html_math_renderer("mathml", (visit_inline_math, None), (visit_display_math, None))
    app.connect("builder-inited", keep_outputs_out_of_the_repository)   # after myst-nb's
    app.connect("source-read", add_table_of_contents)
    app.connect("doctree-read", link_repository_files)     # after Sphinx lists downloads
    app.connect("doctree-resolved", drop_remote_stylesheets)
    app.connect("html-page-context", add_lesson_header)
    app.connect("build-finished", copy_front_page)
