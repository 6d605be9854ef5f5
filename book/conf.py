"""Sphinx's configuration of the course's book (scripts/book.py writes the source it reads)."""

project = "Attention, built by hand"
author = "the course's authors"
extensions = ["myst_nb", "sphinx-mathjax-offline"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# The notebooks are committed executed: the book shows their outputs and runs nothing.
nb_execution_mode = "off"
# The checks' verdict records come with text/html and text/plain beside them, which the book shows;
# a notebook's sections may start at level 3 under its title.
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
myst_enable_extensions = ["dollarmath", "amsmath"]
# Markdown links to another page by its file ([x](notebooks/00_gpu_basics.ipynb)) become page links.
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {"show_toc_level": 2, "use_download_button": False}
html_show_sourcelink = False
html_copy_source = False


def setup(app):
    # Every page loads MathJax: the navigation beside each page holds titles with math in them.
    app.set_html_assets_policy("always")
