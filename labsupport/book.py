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
