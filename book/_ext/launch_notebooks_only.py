"""Sphinx extension: a launch button (Colab) only on pages that are .ipynb notebooks.

The build adds Jupyter Book's Colab launch button when it knows the book's GitHub repository
(labsupport.ops.bookbuild). sphinx-book-theme gives one to every page it takes for a notebook,
MyST Markdown pages with code cells (book/methodology.md) included, and Colab opens only .ipynb
files: on those pages the button would lead to an error, so it is taken off again.
"""

from pathlib import Path


def _drop_launch_buttons(app, pagename, templatename, context, doctree):
    if Path(app.env.doc2path(pagename)).suffix == ".ipynb":
        return
    buttons = context.get("header_buttons")
    if buttons:
        buttons[:] = [b for b in buttons if b.get("label") != "launch-buttons"]


def setup(app):
    # After sphinx-book-theme's add_launch_buttons (priority 501), before the page is written.
    app.connect("html-page-context", _drop_launch_buttons, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
