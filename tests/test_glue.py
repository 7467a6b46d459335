"""The static explorer: every panel rendered in the page, switched by inline JavaScript."""

import json
import re

import pytest

from labsupport import glue


def test_html_explorer_holds_every_panel_in_order_and_cannot_close_its_script():
    h = glue.html_explorer("batch sweep", "batch", {1: "<b>one</b>", 16: "sixteen </script><i>x</i>"}).data
    assert h.count("<script>") == 1 and h.count("</script>") == 1, "a panel cannot end the script early"
    keys = json.loads(re.search(r"const keys = (\[.*?\]);", h).group(1))
    panels = json.loads(re.search(r"const panels = (\[.*?\]);", h).group(1).replace("<\\/", "</"))
    assert keys == ["1", "16"] and panels == ["<b>one</b>", "sixteen </script><i>x</i>"]
    assert 'max="1"' in h and 'id="explorer-batch_sweep-panel"' in h
    assert "<b>one</b></div>" in h, "the first panel is shown before any script runs"
    assert "http" not in h, "nothing is fetched"


def test_html_explorer_needs_a_panel():
    with pytest.raises(ValueError):
        glue.html_explorer("x", "x", {})
