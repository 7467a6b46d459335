"""Sphinx extension: every figure opens at full size, and its alt text says what it shows.

A figure a notebook cell draws reaches the page as a PNG that myst-nb writes out and an image
node whose alt text, unless the cell's metadata names one, is left to docutils, which writes
the file's path. labsupport.figures puts the figure's description (its title, its axes, what
its legend names, the takeaway) in the PNG itself, as a "Description" text chunk; here, once a
page's doctree is resolved, each PNG's description becomes its image's alt text, and every
image is wrapped in a link to its full-size file under _images/ (as Sphinx does by itself only
for images given a width or a scale), so that a reader on a phone can open it and zoom.
An image whose PNG carries no description keeps what docutils gives it; the browser test
(tests/test_browser.py) fails on such a page.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from docutils import nodes
from sphinx.util.osutil import relative_uri


def png_description(path: Path) -> str | None:
    """The description a PNG carries (labsupport.figures.DESCRIPTION_KEY), or None."""
    from PIL import Image

    from labsupport.figures import DESCRIPTION_KEY

    try:
        with Image.open(path) as im:
            im.load()  # text chunks after the image data are read with it
            return (im.text or {}).get(DESCRIPTION_KEY) or None
    except (OSError, ValueError):
        return None


def _describe_and_link(app, doctree, docname):
    if app.builder.format != "html":
        return
    images_dir = relative_uri(app.builder.get_target_uri(docname), "_images")
    for image in list(doctree.findall(nodes.image)):
        uri = image["uri"]
        if not uri.lower().endswith(".png") or "://" in uri:
            continue
        description = png_description(Path(app.srcdir) / uri)
        if description and not image.get("alt"):
            image["alt"] = description
        if isinstance(image.parent, nodes.reference) or uri not in app.env.images:
            continue
        link = nodes.reference(
            "",
            "",
            internal=True,
            refuri=posixpath.join(images_dir, app.env.images[uri][1]),
            classes=["figure-full-size"],
        )
        image.replace_self(link)
        link.append(image)


def setup(app):
    app.connect("doctree-resolved", _describe_and_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
