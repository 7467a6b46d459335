"""Text from a run, as a page may show it: the one way every text field of a run (a GPU's name,
a version, a label, a step's name) reaches HTML.

A run's text is a stranger's text. A control character in it (a newline, a tab, an escape, a
zero-width or bidirectional format character, U+2028 and U+2029) is refused, never shown: it
can end the line, block or cell the text was put in, or make the text read as other than it
is. What is left is escaped for where it lands (HTML text or an attribute's value); it is never
pasted into MyST or any other markup that a parser reads again.
"""

from __future__ import annotations

import html
import unicodedata

REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


class UnsafeText(ValueError):
    """A text field holding a character it may not (one line naming the field and the character)."""


def checked(value, field: str) -> str:
    """`value` as text, or UnsafeText naming `field` and its first refused character."""
    text = str(value)
    for c in text:
        what = REFUSED_CATEGORIES.get(unicodedata.category(c))
        if what:
            raise UnsafeText(f"{field} holds {what} (U+{ord(c):04X}), which is refused")
    return text


def to_html(value, field: str, attribute: bool = False) -> str:
    """`value` checked, then escaped as HTML text, or as an attribute's value (quotes too)."""
    return html.escape(checked(value, field), quote=attribute)
