"""The course as a static book (make book, scripts/book.py): built once from the committed notebooks,
then read as a student would before installing anything. No page holds a line of any exercise's
solution, nor the library's version that reveal prints; every page opens in headless Chromium (as
tests/test_browser.py drives it) with its figures loaded, its internal links resolved and its math
typeset offline; the navigation walks every notebook in the course's order; each notebook's page
says where it runs. A screenshot of notebook 02's page is kept beside the book."""

import html
import importlib.util
import inspect
import re
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from selenium.webdriver.common.by import By

from test_browser import headless_chromium
from test_notebook_design import NOTEBOOKS, solutions, substantive

ROOT = Path(__file__).resolve().parent.parent
REPO = "https://github.com/example/attention-course"

spec = importlib.util.spec_from_file_location("book", ROOT / "scripts" / "book.py")
book = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    seconds = book.build(out / "html", REPO, "main", source=out / "source")
    print(f"the book built in {seconds:.1f} s")
    return out / "html"


def shown(page):
    """A page's text as the browser shows it: tags stripped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def pages(site):
    return sorted(site.glob("*.html")) + sorted((site / "notebooks").glob("*.html"))


def test_every_notebook_and_page_is_built(site):
    built = {p.stem for p in (site / "notebooks").glob("*.html")}
    assert built == {p.stem for p in NOTEBOOKS}
    for name in ("index", "instructors", "classroom"):
        assert (site / f"{name}.html").is_file(), name


def test_no_page_holds_a_line_of_a_solution(site):
    """A solution line is one of the notebook's solution or of the library's version that reveal prints,
    long enough to be the student's own work, and found in no cell of any student copy (a stub's
    signature and docstring, a kernel shown above the exercise, a contract's words)."""
    from attention_lib.checks import EXERCISES
    given = "\n".join(cell.source for path in NOTEBOOKS
                       for cell in book.student_copies.student_copy(nbformat.read(path, as_version=4), path.name).cells)
    lines = {}
    for path in NOTEBOOKS:
        for _, exercise_id, body in solutions(path):
            parts = EXERCISES[exercise_id].solution
            library = [line for part in (parts if isinstance(parts, tuple) else (parts,))
                       for line in inspect.getsource(getattr(part, "py_func", part)).splitlines()]
            for line in body + library:
                if substantive(line) and substantive(line) not in given:
                    lines[substantive(line)] = exercise_id
    assert len(lines) > 300                                  # every exercise contributes
    found = [(page.name, exercise_id, line) for page in pages(site)
             for text in [shown(page)]
             for line, exercise_id in lines.items() if line in text]
    assert not found, found[:5]


def test_exercises_are_blank_with_their_hints_folded(site):
    page = site / "notebooks" / "02_scaled_scores.html"
    assert shown(page).count("raise NotImplementedError()") >= 2
    assert re.search(r'<details class="hints"><summary>Hints for <code>02_scores_tiled</code>', page.read_text())
    assert 'reveal("02_scores_tiled")' in shown(page) and "The library's version" not in shown(page)


def test_each_notebook_page_says_where_it_runs(site):
    for path in NOTEBOOKS:
        page = (site / "notebooks" / f"{path.stem}.html").read_text()
        colab = f"https://colab.research.google.com/github/example/attention-course/blob/main/notebooks/{path.name}"
        assert colab in page and "make lab" in page, path.name
    assert "(optional)" in (site / "notebooks" / "04x_softmax_costs.html").read_text()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    page = headless_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield page
    finally:
        page.quit()


def settled(browser, seconds=30):
    """Wait until the page and its images have loaded and MathJax has typeset (where it is used)."""
    deadline = time.monotonic() + seconds
    script = ("return document.readyState === 'complete' && [...document.images].every(i => i.complete) && "
              "(!window.MathJax || !MathJax.startup || MathJax.startup.promise === undefined || "
              "document.querySelectorAll('.math').length === document.querySelectorAll('mjx-container').length)")
    while time.monotonic() < deadline:
        if browser.execute_script(script):
            return
        time.sleep(0.2)
    pytest.fail(f"{browser.current_url}: not loaded and typeset after {seconds} s")


def rendered(browser, name):
    """The page on show, loaded and typeset, with no broken image, file link or untypeset formula;
    returns how many of the course's figures (images in cell outputs) it shows."""
    settled(browser)
    broken = browser.execute_script("return [...document.images].filter(i => !i.naturalWidth).map(i => i.src)")
    assert not broken, (name, broken)
    for href in browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)"):
        url = urlparse(href)
        if url.scheme == "file":
            assert Path(unquote(url.path)).is_file(), (name, href)
    untypeset = browser.execute_script("return document.querySelectorAll('.math:not(:has(mjx-container))').length")
    assert not untypeset, (name, untypeset)
    return browser.execute_script("return document.querySelectorAll('.cell_output img').length")


def test_every_page_renders_and_the_navigation_walks_the_course_in_order(site, browser):
    browser.get((site / "index.html").as_uri())
    figures, visited = rendered(browser, "index.html"), []
    for _ in range(len(NOTEBOOKS) + len(book.PAGES) + 1):
        following = browser.find_elements(By.CSS_SELECTOR, "a.right-next")
        if not following:
            break
        browser.get(following[0].get_attribute("href"))
        visited.append(Path(urlparse(browser.current_url).path).stem)
        figures += rendered(browser, visited[-1])
        if visited[-1] == "02_scaled_scores":
            shot = site.parent / "02_scaled_scores.png"
            assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert visited == [p.stem for p in NOTEBOOKS] + [name for _, name in book.PAGES]
    assert figures >= len(NOTEBOOKS)                         # the course's figures, not only the theme's
    for page in ("genindex", "search"):
        browser.get((site / f"{page}.html").as_uri())
        rendered(browser, page)
