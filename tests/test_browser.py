"""The student's view in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven by selenium) opens JupyterLab as `make lab` serves it, runs notebook 00's student copy with
Run All from the menu (every check says "not implemented yet"), types an answer into the first
exercise through the page, runs it and its check, reads "✔ ... [ok]" in green from the page, and
takes a screenshot into the test's temporary folder."""

import importlib.util
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from test_classroom_lab import TOKEN, running_lab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "00_gpu_basics.ipynb"
# The first exercise's answer, typed on one line: a line break would meet the editor's auto-indent.
ANSWER = "if cuda.grid(1) < out.shape[0]: out[cuda.grid(1)] = alpha * x[cuda.grid(1)] + y[cuda.grid(1)]"
# The flags the machine's browser needs here: no sandbox as root, and no network beyond loopback.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]
# Within the notebook on show (JupyterLab keeps other tabs in the page, hidden).
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

spec = importlib.util.spec_from_file_location("student_copies", ROOT / "scripts" / "student_copies.py")
student_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_copies)


def wait_for(what, probe, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"the page: {what}, not after {seconds} s")


def headless_chromium(profile):
    """Headless Chromium driven by selenium, its profile in the folder `profile`; a one-line failure
    naming the packages where the browser or its driver is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("no chromium or chromedriver on the PATH: apt-get install chromium chromium-driver "
                    "(.ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture
def browser(tmp_path):
    page = headless_chromium(tmp_path / "chromium-profile")
    try:
        yield page
    finally:
        page.quit()


def text(element):
    """An element's text whether or not it is scrolled into view."""
    return element.get_attribute("textContent") or ""


def kernel_idle(browser):
    """Whether the notebook's kernel says it is idle: in the notebook's toolbar (JupyterLab 4.6 and on,
    its execution indicator) or in the status bar (earlier versions)."""
    indicators = browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Notebook-ExecutionIndicator")
    if any(i.get_attribute("data-status") == "idle" for i in indicators):
        return True
    return "Idle" in text(browser.find_element(By.CSS_SELECTOR, "#jp-main-statusbar"))


def test_a_student_runs_all_answers_and_sees_the_check_pass(tmp_path, browser):
    exercises = [e.exercise_id for e in student_copies.exercises(
        nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4))]
    with running_lab(tmp_path / "my-notebooks", tmp_path / "lab.log") as (url, _):
        browser.get(f"{url}/lab/tree/{NOTEBOOK}?token={TOKEN}")
        wait_for("the notebook with its kernel idle", lambda: browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Cell")
                 and kernel_idle(browser), 90)

        def prompts():
            return [text(p) for p in browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-CodeCell .jp-InputPrompt")]

        # Run > Run All Cells acts on the current widget: the notebook is made current first (a click on
        # its first cell, then command mode), and the run is seen to start; a click the page lost while
        # it was busy (the file browser still current) is made again, twice at most.
        for attempt in range(3):
            [c for c in browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Cell") if c.is_displayed()][0].click()
            ActionChains(browser).send_keys(Keys.ESCAPE).perform()
            menu = next(m for m in browser.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if m.text == "Run")
            menu.click()
            wait_for("Run > Run All Cells", lambda: [i for i in browser.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
                                                     if i.text == "Run All Cells"], 10)[0].click()
            try:
                wait_for("Run All started", lambda: any(p.strip() not in ("", "[ ]:") for p in prompts()), 30)
                break
            except pytest.fail.Exception:
                if attempt == 2:
                    raise

        seen = []

        def verdicts():
            """Every exercise's verdict, once every cell has run; a cell's number shows when it starts,
            its output may come a moment later (on a busy machine, seconds), so the verdicts are
            awaited too."""
            shown_prompts = prompts()
            if not shown_prompts or any("*" in p or p.strip() in ("", "[ ]:") for p in shown_prompts):
                return None                                       # still running, or not reached yet
            seen[:] = [text(o) for o in browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .attention-lib-verdict")]
            shown = {e for e in exercises if any(v.startswith((f"✘ {e} [", f"✔ {e} [")) for v in seen)}
            return list(seen) if shown == set(exercises) else None
        try:
            found = wait_for("every cell run by Run All, and every exercise's verdict shown", verdicts, 180)
        except pytest.fail.Exception:
            browser.save_screenshot(str(tmp_path / "after-run-all.png"))
            pytest.fail(f"after Run All the page shows the verdicts {seen}, not one for each of {exercises}; the "
                        f"cells' prompts: {[p.strip() for p in prompts()]} (a screenshot: {tmp_path / 'after-run-all.png'})")
        # Every exercise's check says so (notebook 00 also shows a check of its own before them).
        for exercise in exercises:
            assert any(v.startswith(f"✘ {exercise} [not_implemented]: not implemented yet. Hint:") for v in found), found
        assert not any(v.startswith("✔") for v in found), found

        # Into the first exercise's answer cell, in command mode, one cell at a time.
        [c for c in browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Cell") if c.is_displayed()][0].click()
        ActionChains(browser).send_keys(Keys.ESCAPE).perform()
        active = lambda: text(browser.find_element(By.CSS_SELECTOR, f"{PANEL} .jp-Cell.jp-mod-active"))
        for _ in range(200):
            if "def scale_add_kernel" in active() and "raise NotImplementedError()" in active():
                break
            ActionChains(browser).send_keys("j").perform()
        assert "def scale_add_kernel" in active(), "no answer cell for 00_scale_add in the page"
        # Edit mode, the stub's last line selected (Shift+Home stops at its indentation), the answer typed.
        (ActionChains(browser).send_keys(Keys.ENTER).key_down(Keys.CONTROL).send_keys(Keys.END).key_up(Keys.CONTROL)
         .key_down(Keys.SHIFT).send_keys(Keys.HOME).key_up(Keys.SHIFT).send_keys(ANSWER).perform())
        wait_for("the answer typed in", lambda: ANSWER in active(), 10)
        # Run the answer (the check cell after it becomes active), then run the check.
        ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()

        def passed():
            outputs = browser.find_elements(By.CSS_SELECTOR, f"{PANEL} .attention-lib-verdict")
            return next((o for o in outputs if text(o).startswith("✔ 00_scale_add [ok]")), None)
        verdict = wait_for("✔ 00_scale_add [ok]", passed, 120)
        colour = verdict.find_element(By.CSS_SELECTOR, "span").value_of_css_property("color")
        assert colour in ("rgb(26, 127, 55)", "rgba(26, 127, 55, 1)"), f"the verdict is not green: {colour}"
        shot = tmp_path / "student-view.png"
        assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
