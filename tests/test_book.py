"""The book builds from the recorded runs with warnings as errors, and shows their numbers."""

import re

from labsupport import runs
from labsupport.chapters import kernels_in_one_token as one_token


def test_book_shows_the_recorded_numbers(built_book):
    published = runs.load_run(one_token.CHAPTER)  # the run the book was built from, in runs/
    html = (built_book / "notebooks" / "kernels_in_one_token.html").read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    s = one_token.summary(published)
    assert f"{s.kernels:,d} kernels for one token" in text
    assert f"{s.matmul_tbs:.2f}" in text and f"{s.wall_ms:.2f} ms" in text
    assert published.run_id in text
    pasted = re.findall(r'class="pasted-text">([^<]*)<', html)
    assert len(pasted) >= 40
    assert not [p for p in pasted if p.strip() in ("", "nan", "None", "nan%")]
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", html, re.S)]
    assert len(cells) > 100
    assert not [c for c in cells if c in ("nan", "None", "NaN", "<NA>")]
    assert "{glue" not in text and "glue:" not in text
    assert (built_book / "book" / "methodology.html").is_file()


def test_timeline_traces_are_downloadable(built_book):
    """Each chapter with a timeline figure links to the raw trace behind it, served with the book."""
    pages = {
        "kernels_in_one_token": "trace.json.gz",
        "what_a_kernel": "burst_trace.json.gz",
        "launch_overhead": "trace-eager.json.gz",
    }
    for page, name in pages.items():
        html = (built_book / "notebooks" / f"{page}.html").read_text()
        links = re.findall(r'href="(\.\./runs/[^"]+)"', html)
        assert any(link.endswith("/" + name) for link in links), page
        for link in links:
            assert (built_book / "notebooks" / link).resolve().is_file(), link
        assert "Perfetto" in html and "chrome://tracing" in html


def test_a_reader_can_download_what_a_chapter_needs(built_book):
    """The page on running a chapter links a labsupport wheel and the requirements, both served
    with the book, and the wheel holds every module of the package."""
    import zipfile
    from pathlib import Path

    html = (built_book / "book" / "run_it_yourself.html").read_text()
    links = re.findall(r'href="(\.\./download/[^"]+)"', html)
    assert {Path(u).suffix for u in links} == {".whl", ".txt"}
    for link in links:
        assert (built_book / "book" / link).resolve().is_file(), link
    wheel = next((built_book / "book" / u).resolve() for u in links if u.endswith(".whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    package = Path(runs.__file__).resolve().parents[1]
    expected = {str(p.relative_to(package.parent)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= names
