"""The course as a static book: the committed, executed notebooks as a student meets them, built by
Sphinx with myst-nb (no re-execution) and sphinx-book-theme (book/conf.py).

    python scripts/book.py [--out build/book] [--repo https://github.com/OWNER/NAME] [--branch main]

A page shows every markdown cell and every output the course computes, and each exercise as the
student copy has it: the answer cell with its solution cut (nbgrader's own cut, as `make student`
makes it), the check and reveal cells without their outputs, and the hints folded under the check.
Each page opens with where it runs: a launch link to Colab (when the repository's address is known:
--repo, or the git remote `origin`) and `make lab` on one's own machine. The landing page is the
README's opening and its notebook table; INSTRUCTORS.md and the classroom guide are pages of their own.
"""

import argparse
import copy
import html
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import student_copies  # noqa: E402  (a script beside this one, not a package)

OUT = ROOT / "build" / "book"
SOURCE = ROOT / "build" / "book-source"
# Markdown pages besides the notebooks: (file in the repository, page name in the book).
PAGES = [("INSTRUCTORS.md", "instructors"), ("classroom/README.md", "classroom")]
# README's table rows: | 04x | [Softmax costs (optional)](notebooks/04x_softmax_costs.ipynb) | what ... | time |
TABLE_ROW = re.compile(r"^\| (\d\dx?) \| \[(.+?)\]\(notebooks/([\w.]+\.ipynb)\) \| (.+?) \|", re.M)
LINK = re.compile(r"\[([^\]]*)\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def github_address(repo):
    """`repo` as https://github.com/OWNER/NAME, or None when it is not a GitHub repository."""
    found = re.match(r"^(?:https://github\.com/|git@github\.com:)([\w.-]+/[\w.-]+?)(?:\.git)?/?$", repo or "")
    return f"https://github.com/{found.group(1)}" if found else None


def origin():
    """The git remote `origin`'s address, or '' outside a clone that has one."""
    shown = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    return shown.stdout.strip() if shown.returncode == 0 else ""


def where_it_runs(name, repo, branch):
    """The markdown cell that opens a page: a launch link (with a known repository) and make lab."""
    lines = []
    if repo:
        colab = f"https://colab.research.google.com/github/{repo.removeprefix('https://github.com/')}/blob/{branch}/notebooks/{name}"
        lines.append(f"[Open this notebook on Colab]({colab}) (choose a GPU runtime; notebook 00's first cell sets the "
                     "course up there). The notebook opened there holds the solutions: keep them folded.")
    lines.append("On your own machine, `make lab` in the course's folder installs it and opens your own copy, "
                 "every exercise blank.")
    return nbformat.v4.new_markdown_cell("\n\n".join(lines), metadata={"tags": ["book-where-it-runs"]})


def folded_hints(exercise_id, hints):
    """The exercise's hints as a folded block, opened only on purpose."""
    items = "".join(f"<li>{html.escape(text)}</li>" for text in hints)
    return nbformat.v4.new_markdown_cell(f"<details class=\"hints\"><summary>Hints for <code>{exercise_id}</code> "
                                         f"(try without them first)</summary><ol>{items}</ol></details>")


def student_page(path, repo, branch):
    """One notebook as the book shows it (a new NotebookNode)."""
    from attention_lib.checks import EXERCISES
    notebook = nbformat.read(path, as_version=4)
    blank = student_copies.student_copy(notebook, path.name)          # nbgrader's cut, cell for cell
    page = copy.deepcopy(notebook)
    hints_after = {}
    for exercise in student_copies.exercises(notebook, path.name):
        answer = page.cells[exercise.answer_cell]
        answer.source, answer.outputs, answer.execution_count = blank.cells[exercise.answer_cell].source, [], None
        page.cells[exercise.check_cell].outputs = []
        hints_after[exercise.check_cell] = folded_hints(exercise.exercise_id, EXERCISES[exercise.exercise_id].hints)
    for cell in page.cells:
        if student_copies.is_reveal_cell(cell):
            cell.outputs = []
    cells = []
    for i, cell in enumerate(page.cells):
        cells.append(cell)
        if i in hints_after:
            cells.append(hints_after[i])
    title = cells[0]
    if re.match(r"\d\dx_", path.name) and "optional" not in title.source.splitlines()[0].lower():
        title.source = re.sub(r"^(# .+)$", r"\1 (optional)", title.source, count=1, flags=re.M)
    page.cells = [title, where_it_runs(path.name, repo, branch)] + cells[1:]
    return page


def linked(text, repo, branch, here=""):
    """Markdown whose relative links point at the book's pages (notebooks) or at the repository."""
    def target(match):
        text, link = match.groups()
        name = Path(link).name
        if link.startswith("notebooks/") and name.endswith(".ipynb"):
            return f"[{text}]({'../' if here else ''}notebooks/{name})"
        if repo:
            return f"[{text}]({repo}/blob/{branch}/{(Path(here).parent / link).as_posix() if here else link})"
        return text                                   # no repository to point at: the words alone
    return LINK.sub(target, text)


def landing_page(readme, notebooks):
    """The course's arc (README's opening) and its notebook table, each title a link to its page."""
    opening = readme.split("\n## ", 1)[0].strip()
    rows = ["| # | notebook | what it builds |", "|---|---|---|"]
    for number, title, name, builds in TABLE_ROW.findall(readme):
        if name in notebooks:
            rows.append(f"| {number} | [{title}](notebooks/{name}) | {builds} |")
    arc = readme.split("## The notebooks", 1)[1].split("\n## ", 1)[0]
    after_table = "\n".join(line for line in arc.splitlines() if line.strip() and not line.startswith("|"))
    toc = "\n".join(f"notebooks/{Path(n).stem}" for n in notebooks)
    pages = "\n".join(name for _, name in PAGES)
    return (f"{opening}\n\n## The notebooks\n\n" + "\n".join(rows) + f"\n\n{after_table}\n\n"
            "Read a notebook here first, then run it: each page says where.\n\n"
            f"```{{toctree}}\n:caption: Notebooks\n:hidden:\n\n{toc}\n```\n\n"
            f"```{{toctree}}\n:caption: For instructors\n:hidden:\n\n{pages}\n```\n")


def write_source(source, repo, branch):
    """The book's source folder: the landing page, one page per notebook, the instructors' pages."""
    shutil.rmtree(source, ignore_errors=True)
    (source / "notebooks").mkdir(parents=True)
    paths = student_copies.course_notebooks()
    for path in paths:
        nbformat.write(student_page(path, repo, branch), source / "notebooks" / path.name)
    readme = (ROOT / "README.md").read_text()
    (source / "index.md").write_text(linked(landing_page(readme, [p.name for p in paths]), repo, branch))
    for file, name in PAGES:
        (source / f"{name}.md").write_text(linked((ROOT / file).read_text(), repo, branch, here=file))
    return paths


def build(out=OUT, repo=None, branch="main", source=SOURCE):
    """Write the book's source and build its HTML into `out`; returns the seconds Sphinx took."""
    write_source(source, repo, branch)
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(ROOT / "book"),
                    str(source), str(out)], check=True)
    return time.monotonic() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the HTML's folder (default build/book)")
    parser.add_argument("--repo", default=None, help="the repository on GitHub (default: the git remote origin)")
    parser.add_argument("--branch", default="main", help="the branch the launch links open (default main)")
    args = parser.parse_args(argv)
    repo = github_address(args.repo if args.repo is not None else origin())
    if args.repo and not repo:
        parser.error(f"--repo must be a GitHub repository's address (https://github.com/OWNER/NAME), got {args.repo!r}")
    seconds = build(args.out, repo, args.branch)
    launch = f"launch links to {repo}" if repo else "no launch links (the git remote is not on GitHub: set BOOK_REPO)"
    print(f"the book: {args.out / 'index.html'} ({seconds:.0f} s; {launch})")


if __name__ == "__main__":
    main()
