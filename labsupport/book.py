"""Putting run data into the book's prose with myst-nb's `glue`."""
from __future__ import annotations


def glue(name: str, value, display: bool = False) -> None:
    """myst_nb.glue, when myst-nb is installed (the book build).

    A GPU box that only runs the notebooks live (papermill, no Sphinx) need not carry
    myst-nb and its Sphinx dependencies; there the values are simply not glued, which
    only the book build reads.
    """
    try:
        from myst_nb import glue as _glue
    except ImportError:
        return
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()  # np.float64 would be shown as 'np.float64(...)', unformattable
    _glue(name, value, display=display)


def glue_all(values: dict, prefix: str = "") -> None:
    """Glue every value of a dict under `prefix + key`."""
    for key, value in values.items():
        glue(prefix + key, value)


def glue_text(name: str, text: str) -> None:
    """Glue a string for `{glue:md}` (plain `{glue}` would show it with quotes)."""
    from IPython.display import Markdown

    glue(name, Markdown(text))


def run_file_link(run, name: str, text: str | None = None):
    """A download link, from a chapter page, to a file of the run it shows.

    The book serves runs/ at its root (html_extra_path in _config.yml), so chapter pages
    (under notebooks/) reach a run's files at ../runs/<chapter>/<run id>/<file>.
    """
    from IPython.display import HTML

    run.file(name)  # a clear error if the run has no such file
    href = f"../runs/{run.chapter}/{run.run_id}/{name}"
    return HTML(f'<p><a href="{href}" download>{text or name}</a></p>')


def trace_download(run, name: str):
    """The download link for a raw profiler trace, with how to open it."""
    from IPython.display import HTML

    run.file(name)
    href = f"../runs/{run.chapter}/{run.run_id}/{name}"
    size = run.file(name).stat().st_size
    size = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
    return HTML(f'<p class="trace-download">Raw profiler trace behind this figure: '
                f'<a href="{href}" download><code>{name}</code></a> ({size}, run {run.run_id}). '
                f'Open it in <a href="https://ui.perfetto.dev">Perfetto</a> (Open trace file) or in Chrome at '
                f'<code>chrome://tracing</code> (Load); both read the compressed file as it is.</p>')
