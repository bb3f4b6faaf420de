"""The course's website (`bash course.sh --site` builds it into site/), read in a real browser.

Every page is loaded in headless Chromium, driven by selenium, from a web server on the
loopback address, as a reader's browser would load it from a host. A page fails on an error
in the browser's console, an image that did not load, a link to a page or an anchor of the
site that does not exist, or anything loaded from another host (the site must work with
no network). A screenshot of lesson 1 is saved and must not be blank.

Skipped, saying why, where selenium, Chromium, its driver or the built site is missing;
with SIMPMD_REQUIRE_BROWSER=1 (as .ci/run sets) each of those fails instead.
"""
import contextlib
import functools
import hashlib
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import pytest

from simpmd.course import REPOSITORY

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
SCREENSHOT = ROOT / "build" / "site-test" / "01_devices_and_meshes.png"
LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
REQUIRED = os.environ.get("SIMPMD_REQUIRE_BROWSER") == "1"

# Chromium with nothing that reaches the network by itself (this machine has none) and a
# profile of its own, new for each run.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1600"]


def unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"SIMPMD_REQUIRE_BROWSER=1, but {reason}")
    pytest.skip(reason)


def find_program(*names: str):
    return next((found for found in map(shutil.which, names) if found), None)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def served(folder: pathlib.Path):
    """A folder served over HTTP on a free port of 127.0.0.1; yields its origin."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def require_built_site():
    """Skip (or fail, where required) unless site/ is built, and from today's sources."""
    if not (SITE / "index.html").is_file():
        unavailable(f"the site is not built ({SITE / 'index.html'} is missing): "
                    "run `bash course.sh --site` first")
    sources = [ROOT / "README.md", *(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "docs").glob("*")]
    newer = [p.relative_to(ROOT).as_posix() for p in sources
             if p.stat().st_mtime > (SITE / "index.html").stat().st_mtime]
    if newer:
        unavailable(f"the site is older than {', '.join(sorted(newer)[:3])}"
                    f"{' ...' if len(newer) > 3 else ''}: run `bash course.sh --site` again")


@pytest.fixture(scope="module")
def origin():
    """The built site, served for the length of this module."""
    require_built_site()
    with served(SITE) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (it is in the site extra: pip install -e '.[site]')")
    chromium = find_program("chromium", "chromium-browser", "google-chrome")
    driver_path = find_program("chromedriver", "chromium-driver")
    if chromium is None or driver_path is None:
        unavailable("Chromium or its driver is not installed "
                    "(on Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="simpmd-chromium-")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


# What the page reports about itself once loaded: its images that did not load, every link,
# every element id (an anchor a link can reach), and every resource it fetched.
READ_PAGE = """
const images = Array.from(document.images);
images.forEach(img => { img.loading = "eager"; });
return {
  complete: images.every(img => img.complete),
  broken: images.filter(img => img.complete && img.naturalWidth === 0).map(img => img.src),
  links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
  ids: Array.from(document.querySelectorAll("[id], a[name]")).map(e => e.id || e.name),
  resources: performance.getEntriesByType("resource").map(r => r.name),
  undrawn_math: Array.from(document.querySelectorAll("math"))
    .filter(m => m.getBoundingClientRect().width === 0).map(m => m.textContent),
};
"""


def read_page(browser, url: str) -> dict:
    """Load a page, wait until its images are in, and say what it reports, with the errors
    its console logged."""
    browser.get_log("browser")                        # forget what earlier pages logged
    browser.get(url)
    deadline = time.monotonic() + 20
    while True:
        page = browser.execute_script(READ_PAGE)
        if page["complete"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    page["errors"] = console_errors(browser)
    return page


def console_errors(browser) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def local_target(origin: str, url: str):
    """(page path in the site, anchor) of a link into the site, or None for another host."""
    if not url.startswith(origin + "/"):
        return None
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.unquote(parts.path).lstrip("/")
    if path == "" or path.endswith("/"):
        path += "index.html"
    return path, urllib.parse.unquote(parts.fragment)


def site_pages(site: pathlib.Path) -> list[str]:
    """Every HTML page of a site, as a path relative to it (the theme's templates under
    _static are not pages)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.relative_to(site).as_posix().startswith("_static/"))


def problems(browser, origin: str, site: pathlib.Path) -> dict[str, list[str]]:
    """Load every page of a site and list what is wrong, by kind: console errors, images
    that did not load, resources from another host, links to a missing page or anchor,
    math the browser drew nothing of."""
    seen = {page: read_page(browser, f"{origin}/{page}") for page in site_pages(site)}
    found = {"console": [], "images": [], "foreign": [], "links": [], "math": []}
    for page, report in seen.items():
        found["console"] += [f"{page}: {message}" for message in report["errors"]]
        found["images"] += [f"{page}: {src}" for src in report["broken"]]
        found["math"] += [f"{page}: {text}" for text in report["undrawn_math"]]
        if not report["complete"]:
            found["images"].append(f"{page}: images still loading after 20 s")
        found["foreign"] += [f"{page}: {url}" for url in report["resources"]
                             if not url.startswith(origin + "/")]
        for target in filter(None, (local_target(origin, url) for url in report["links"])):
            path, anchor = target
            if not (site / path).is_file():
                found["links"].append(f"{page} -> {path} (no such file)")
            elif anchor and path in seen and anchor not in seen[path]["ids"]:
                found["links"].append(f"{page} -> {path}#{anchor} (no such anchor)")
    return {kind: sorted(set(items)) for kind, items in found.items()}


@pytest.fixture(scope="module")
def found(browser, origin):
    """What is wrong with the built site, every page read once."""
    return problems(browser, origin, SITE)


def test_the_site_has_the_front_page_every_lesson_and_the_docs():
    require_built_site()
    pages = set(site_pages(SITE))
    expected = ["index.html", "search.html", *(f"notebooks/{stem}.html" for stem in LESSONS),
                *(f"docs/{p.stem}.html" for p in (ROOT / "docs").glob("*.md"))]
    assert not [page for page in expected if page not in pages], \
        f"pages missing from the site: {[page for page in expected if page not in pages]}"
    assert not (ROOT / "jupyter_execute").exists(), \
        "the build wrote jupyter_execute/ into the repository (docs/conf.py sends it to build/)"
    front = (SITE / "index.html").read_text(encoding="utf-8")
    assert "learn SPMD parallelism the way JAX does it" in front, "index.html is not the README"
    table = next(t for t in re.findall(r"<table.*?</table>", front, flags=re.S) if "what it teaches" in t)
    linked = re.findall(r'href="(notebooks/[^"#]+)"', table)   # the README's links to the notebooks
    assert linked == [f"notebooks/{stem}.html" for stem in LESSONS], linked


@pytest.mark.parametrize("stem", LESSONS)
def test_every_lesson_page_says_its_time_and_opens_in_colab(stem):
    """The header carries the time the notebook's first cell states, and the README's Colab link."""
    require_built_site()
    html = (SITE / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    first = "".join(json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"][0]["source"])
    minutes = re.search(r"\*\*Time:\*\* about (\d+) minutes", first).group(1)
    header = re.search(r'<p class="simpmd-lesson-header">(.*?)</p>', html, flags=re.S)
    assert header, f"{stem}.html has no header with the lesson's time and Colab link"
    assert f"about {minutes} minutes" in header.group(1)
    readme_link = re.search(rf"\]\((https://colab\.research\.google\.com/[^)]*/{stem}\.ipynb)\)",
                            (ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    assert f'href="{readme_link}"' in header.group(1), "the Colab link differs from the README's"


@pytest.mark.parametrize("stem", LESSONS)
def test_every_formula_of_a_lesson_is_mathml_on_its_page(stem):
    """Each $...$ of a lesson's Markdown becomes a <math> element (no MathJax to draw TeX)."""
    require_built_site()
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    text = re.sub(r"`[^`]*`", "", "".join("".join(c["source"]) for c in cells
                                          if c["cell_type"] == "markdown"))
    formulas = len(re.findall(r"(?<![\\$])\$(?!\s)[^$\n]+(?<!\s)\$(?!\d)", text)) + text.count("$$") // 2
    html = (SITE / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    assert html.count("<math ") >= formulas, f"{stem}: {formulas} formulas, {html.count('<math ')} <math>"


def test_links_to_repository_files_go_to_github():
    """docs/conf.py turns a link to a script or a test (not a page of the site) into a link
    to that file on GitHub, and keeps no copy of it to download."""
    try:
        from docutils import nodes
        from sphinx import addnodes
    except ImportError:
        unavailable("Sphinx is not installed (it is in the site extra: pip install -e '.[site]')")
    import importlib.util
    import types
    spec = importlib.util.spec_from_file_location("site_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    doctree = nodes.paragraph(source=str(ROOT / "docs" / "engine.md"))
    doctree += addnodes.download_reference("", "", nodes.Text("the matrix"),
                                           reftarget="../scripts/test_matrix.sh")
    doctree += addnodes.download_reference("", "", nodes.Text("nothing"), reftarget="../no/such.py")
    listed = {pathlib.Path("scripts/test_matrix.sh"): ({"docs/engine"}, "x/test_matrix.sh")}
    conf.link_repository_files(types.SimpleNamespace(env=types.SimpleNamespace(dlfiles=listed)),
                               doctree)
    link, kept = doctree.children
    assert isinstance(link, nodes.reference) and link.astext() == "the matrix"
    assert link["refuri"] == f"{REPOSITORY}/blob/main/scripts/test_matrix.sh"
    assert isinstance(kept, addnodes.download_reference) and listed == {}


def test_no_page_asks_for_a_script_a_stylesheet_or_a_font_from_another_host():
    """Read in the HTML itself; test_nothing_comes_from_another_host sees what was fetched."""
    require_built_site()
    remote = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//[^>]*>", re.I)
    tags = {page: remote.findall((SITE / page).read_text(encoding="utf-8")) for page in site_pages(SITE)}
    assert not {page: found for page, found in tags.items() if found}, \
        f"pages that load from another host: {({p: f for p, f in tags.items() if f})}"


@pytest.mark.parametrize("kind, what", [
    ("console", "errors in the browser's console"),
    ("images", "images that did not load"),
    ("foreign", "resources fetched from another host"),
    ("links", "links to a page or an anchor the site does not have"),
    ("math", "formulas (MathML) the browser drew nothing of"),
])
def test_every_page_loads_cleanly(found, kind, what):
    assert not found[kind], f"{what}:\n" + "\n".join(found[kind])


def test_the_checks_catch_a_broken_page(browser, tmp_path):
    """The same checks, on a page made with one fault of each kind, find every one of them."""
    (tmp_path / "ok.html").write_text('<p id="here">fine</p>')
    (tmp_path / "index.html").write_text(
        '<script>console.error("boom")</script><math style="display:none"><mi>x</mi></math>'
        '<img src="missing.png">'
        '<link rel="stylesheet" href="http://127.0.0.2:9/remote.css">'
        '<a href="ok.html#here">good</a> <a href="gone.html">gone</a> <a href="ok.html#nowhere">x</a>')
    with served(tmp_path) as url:
        seen = problems(browser, url, tmp_path)
    assert any("boom" in message for message in seen["console"]), seen
    assert seen["images"] == [f"index.html: {url}/missing.png"], seen
    assert seen["foreign"] == ["index.html: http://127.0.0.2:9/remote.css"], seen
    assert seen["math"] == ["index.html: x"], seen
    assert seen["links"] == ["index.html -> gone.html (no such file)",
                             "index.html -> ok.html#nowhere (no such anchor)"], seen


def test_search_finds_the_lessons_on_a_collective(browser, origin):
    """The site's search runs in the browser, on the index built with the site."""
    from selenium.webdriver.common.by import By
    browser.get(f"{origin}/search.html?q=psum_scatter")
    deadline = time.monotonic() + 20
    hits = []
    while time.monotonic() < deadline and not hits:
        hits = [a.get_attribute("href") for a in
                browser.find_elements(By.CSS_SELECTOR, "#search-results a")]
        time.sleep(0.2)
    assert any("notebooks/04_named_axes_collectives.html" in h for h in hits), hits
    assert not console_errors(browser)


def test_lesson_1_looks_like_a_page(browser, origin):
    """A screenshot of lesson 1, saved for a person to look at: its title is on screen
    and the picture is not blank (many pixels away from the background colour)."""
    import numpy as np
    from PIL import Image
    from selenium.webdriver.common.by import By
    browser.get(f"{origin}/notebooks/01_devices_and_meshes.html")
    titles = [h.text for h in browser.find_elements(By.TAG_NAME, "h1") if h.is_displayed()]
    assert titles and titles[0].startswith("Lesson 1"), f"the headings on screen: {titles}"
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    pixels = np.asarray(Image.open(SCREENSHOT).convert("L"), dtype=float)
    background = np.median(pixels)
    ink = np.mean(np.abs(pixels - background) > 40)
    assert pixels.std() > 10 and ink > 0.01, (
        f"the screenshot {SCREENSHOT} looks blank: grey-level std {pixels.std():.1f}, "
        f"{ink:.1%} of pixels away from the background")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the course, and so course.sh, needs 3.11+")
def test_course_site_builds_with_sphinx_and_runs_nothing_else(tmp_path):
    """`bash course.sh --site` on a venv that already has the site extra: it runs Sphinx with
    docs/conf.py over the repository into site/ (a stand-in python records the call), and
    neither installs, nor runs a notebook, the tour or the figures."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    python = venv / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\nif [[ "$1 $2" == "-m sphinx" ]]; then echo "$*" >> {calls}; '
                      f'exit 0; fi\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())   # ensure_venv's stamp
    for init in sorted((ROOT / "simpmd").glob("**/__init__.py")):
        digest.update(init.relative_to(ROOT).as_posix().encode())
    (venv / ".simpmd-site.stamp").write_text(digest.hexdigest() + "\n")
    env = {**os.environ, "SIMPMD_VENV": str(venv), "SIMPMD_JAX": ""}
    run = subprocess.run(["bash", str(ROOT / "course.sh"), "--site"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    sphinx = calls.read_text().split()
    assert sphinx[:4] == ["-m", "sphinx", "-b", "html"] and sphinx[-2:] == [".", "site"]
    assert sphinx[sphinx.index("-c") + 1] == "docs" and "-W" in sphinx
    assert "Installing" not in run.stdout and "== The" not in run.stdout


def test_ci_builds_the_site_and_requires_the_browser_test():
    """.ci/run installs Chromium, builds the site, and runs this file through the README's
    test command with the browser required, after the JAX version matrix."""
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    order = [next(i for i, line in enumerate(commands) if wanted in line) for wanted in (
        "bash scripts/test_matrix.sh", "apt-get install -y -qq chromium chromium-driver",
        "bash course.sh --site", "SIMPMD_REQUIRE_BROWSER=1 bash test.sh tests/course/test_site.py")]
    assert order == sorted(order), commands
