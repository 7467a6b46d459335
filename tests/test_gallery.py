"""`gallery add` on good and hostile archives (each refused in one line, nothing written), the
code that walks runs/ with a gallery in it, and the gallery page's rows from fixture data."""

import csv as csv_module
import errno
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from labsupport import chapters, runs
from labsupport.ops import gallery, gallery_page, pack

from .conftest import FIXTURES, REPO, tree_bytes

pytestmark = pytest.mark.unit

CHAPTER = "what-a-kernel"


def _copy(root, chapter):
    run_id = sorted(p.name for p in (FIXTURES / chapter).iterdir())[-1]
    shutil.copytree(FIXTURES / chapter / run_id, root / chapter / run_id)
    return run_id


@pytest.fixture
def world(tmp_path):
    src = tmp_path / "src"
    run_id = _copy(src, CHAPTER)
    (src / "published.json").write_text(json.dumps({CHAPTER: run_id}))
    archive, _ = pack.pack(CHAPTER, root=src, out_dir=tmp_path / "packs")
    dst = tmp_path / "runs"
    dst.mkdir()
    (dst / "published.json").write_text("{}")
    return archive, dst, run_id


def members(archive):
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def write(path, files: dict, extra=()):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def resealed(files, run_id, name, data):
    """`files` with `name` replaced and both manifests' digests made to match (a well-formed lie)."""
    import hashlib

    files = dict(files)
    files[f"{run_id}/{name}"] = data
    digest = hashlib.sha256(data).hexdigest()
    meta = json.loads(files[f"{run_id}/meta.json"])
    if name != "meta.json":
        meta["files"][name] = digest
        files[f"{run_id}/meta.json"] = json.dumps(meta).encode()
    man = json.loads(files[f"{run_id}/pack.json"])
    for n in (name, "meta.json"):
        man["files"][n] = {"sha256": hashlib.sha256(files[f"{run_id}/{n}"]).hexdigest()}
    files[f"{run_id}/pack.json"] = json.dumps(man).encode()
    return files


def test_a_good_archive_is_filed_under_the_gallery(world):
    archive, dst, run_id = world
    line = gallery.add(archive, dst)
    assert line.startswith(f"added {CHAPTER} run {run_id} (NVIDIA H200") and "\n" not in line
    run = runs.load_run(chapters.by_slug(CHAPTER), run_id, dst / "gallery" / "nvidia-h200")
    assert run.provenance["gpu"] == "NVIDIA H200"
    assert (dst / "published.json").read_text() == "{}", "the manifest is never touched"
    assert [e.run.run_id for e in gallery.entries(dst)] == [run_id]
    assert not [p for p in (dst / "gallery").iterdir() if p.name.startswith(".")]
    with pytest.raises(gallery.GalleryError, match="already in the gallery"):
        gallery.add(archive, dst)


def _hostile(kind, archive, tmp, run_id):
    files = members(archive)
    p = tmp / f"{kind}.tar.gz"
    csv = next(n for n in files if n.endswith(".csv"))
    if kind == "traversal":
        return write(p, {**files, f"{run_id}/../x": b"x"})
    if kind == "absolute":
        return write(p, {**files, str(tmp / "abs-x"): b"x"})
    if kind in ("symlink", "hardlink"):
        info = tarfile.TarInfo(f"{run_id}/link")
        info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
        info.linkname = "/etc/passwd"
        return write(p, files, [info])
    if kind == "device":
        info = tarfile.TarInfo(f"{run_id}/dev")
        info.type = tarfile.CHRTYPE
        return write(p, files, [info])
    if kind == "oversized":
        return write(p, {**files, f"{run_id}/big.csv": b"0" * (pack.MAX_FILE_BYTES + 1)})
    if kind == "wrong checksum":
        return write(p, {**files, csv: files[csv] + b"1,2\n"})
    if kind == "unlisted":
        return write(p, {**files, f"{run_id}/extra.csv": b"a\n1\n"})
    if kind == "missing":
        return write(p, {k: v for k, v in files.items() if k != csv})
    if kind == "two folders":
        return write(p, {**files, "other/x.csv": b"a\n"})
    if kind == "corrupt":
        data = archive.read_bytes()
        p.write_bytes(data[: len(data) // 2] + b"\x00garbage" * 50)
        return p
    if kind == "not gzip":
        p.write_text("<html>not an archive</html>")
        return p
    if kind == "out of range":
        rows = list(csv_module.reader(io.StringIO(files[csv].decode())))
        col = next(i for i, c in enumerate(rows[0]) if c.endswith(("_ms", "_ns")) or c == "kernels")
        rows[1][col] = "-5"
        text = io.StringIO()
        csv_module.writer(text, lineterminator="\n").writerows(rows)
        return write(p, resealed(files, run_id, csv.split("/")[1], text.getvalue().encode()))
    if kind in ("results a string", "results a list", "derived a number"):
        meta = json.loads(files[f"{run_id}/meta.json"])
        meta[kind.split()[0]] = {"results a string": "x", "results a list": [1, 2], "derived a number": 5}[kind]
        return write(p, resealed(files, run_id, "meta.json", json.dumps(meta).encode()))
    if kind == "a run id of 300 characters":
        long_id = run_id + "-" + "x" * (299 - len(run_id))
        renamed = {n.replace(run_id, long_id, 1): d for n, d in files.items()}
        for name in ("meta.json", "pack.json"):
            doc = json.loads(renamed[f"{long_id}/{name}"])
            doc["run_id"] = long_id
            renamed[f"{long_id}/{name}"] = json.dumps(doc).encode()
        return write(p, resealed(renamed, long_id, "meta.json", renamed[f"{long_id}/meta.json"]))
    if kind == "html in provenance":
        meta = json.loads(files[f"{run_id}/meta.json"])
        meta["provenance"]["driver"] = ""
        return write(p, resealed(files, run_id, "meta.json", json.dumps(meta).encode()))
    raise AssertionError(kind)


HOSTILE = {
    "traversal": "leaves its folder",
    "absolute": "absolute path",
    "symlink": "is a link",
    "hardlink": "is a link",
    "device": "not a regular file",
    "oversized": "more than the",
    "wrong checksum": "does not match its SHA-256",
    "unlisted": "is not listed in pack.json",
    "missing": "is listed but missing",
    "two folders": "more than one folder",
    "corrupt": "not a readable .tar.gz archive",
    "not gzip": "not a readable .tar.gz archive",
    "out of range": "is outside",
    "html in provenance": "provenance field 'driver' is empty",
    "results a string": "meta.json's 'results' is not an object",
    "results a list": "meta.json's 'results' is not an object",
    "derived a number": "meta.json's 'derived' is not an object",
    "a run id of 300 characters": "run id",
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_archive_is_refused_in_one_line_with_nothing_written(world, tmp_path, kind):
    archive, dst, run_id = world
    bad = _hostile(kind, archive, tmp_path, run_id)
    before = tree_bytes(tmp_path)
    env = {**os.environ, "LABSUPPORT_RUNS": str(dst), "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "gallery", "add", str(bad)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert HOSTILE[kind] in err[0] and err[0].endswith("nothing was written"), err[0]
    assert tree_bytes(tmp_path) == before and not (dst / "gallery").exists()
    assert not (tmp_path / "abs-x").exists() and not (dst / "x").exists() and not (dst.parent / "x").exists()


def test_html_in_text_fields_is_escaped_on_the_page_and_in_the_listing(world, tmp_path):
    archive, dst, run_id = world
    files = members(archive)
    meta = json.loads(files[f"{run_id}/meta.json"])
    meta["provenance"]["torch"] = "<script>alert(1)</script>"
    bad = write(tmp_path / "x.tar.gz", resealed(files, run_id, "meta.json", json.dumps(meta).encode()))
    good = members(bad)
    man = json.loads(good[f"{run_id}/pack.json"])
    man["label"] = "<img src=x onerror=alert(2)>"
    good[f"{run_id}/pack.json"] = json.dumps(man).encode()  # pack.json lists no digest of itself
    gallery.add(write(tmp_path / "y.tar.gz", good), dst)
    page = gallery_page.html(gallery_page.gather(dst))
    assert "<script>" not in page and "&lt;script&gt;" in page and "<img" not in page
    # A terminal escape, in a run placed by hand (`add` refuses it): the listing does not print it.
    placed = next((dst / "gallery").glob(f"*/{CHAPTER}/{run_id}")) / "meta.json"
    meta = json.loads(placed.read_text())
    meta["provenance"]["utc_time"] = "2026\x1b[31m"
    placed.write_text(json.dumps(meta))
    assert "\x1b" not in "\n".join(gallery.listing(dst))


def test_the_page_renders_rows_from_fixture_runs(tmp_path):
    """A gallery run of two chapters beside the published ones: one row each, normalised to
    the H200's floor (3.15 ms), with its download; the page's zips hold what meta.json lists."""
    src = tmp_path / "src"
    ids = {c: _copy(src, c) for c in ("launch-overhead", "closing-the-gap")}
    (src / "published.json").write_text(json.dumps(ids))
    dst = tmp_path / "runs"
    for c in ids:
        _copy(dst, c)
    (dst / "published.json").write_text(json.dumps(ids))
    for c in ids:
        gallery.add(pack.pack(c, root=src, out_dir=tmp_path / "packs", label="the book's published run")[0], dst)
    df = gallery_page.rows(dst)
    assert sorted(df.chapter) == sorted(ids) and (df.source == "gallery: the book's published run").all()
    assert (df["floor ms"].round(2) == 3.15).all() and (df["x floor"] > 1).all()
    assert (df.kernels > 100).all() and ((df["GPU-busy"] > 0) & (df["GPU-busy"] <= 1)).all()
    assert set(df["timed by"]) <= {"host", "CUDA events"}
    cg = df[df.chapter == "closing-the-gap"].iloc[0]
    assert 0 < cg["matmul x bandwidth"] < 1.2
    page = gallery_page.html(gallery_page.gather(dst))
    assert page.count("<tr>") == 2 + 2 and page.count("../download/gallery/") == 2
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    import serve_gallery

    zips = serve_gallery.write_zips(dst, tmp_path / "html" / "download" / "gallery")
    assert sorted(z.name for z in zips) == sorted(gallery_page.download_name(e) for e in gallery.entries(dst))


def test_code_that_walks_runs_accepts_a_gallery(world):
    """runs, prune, set_aside, recover's pruning leftovers and the run checks leave runs/gallery/ alone."""
    from labsupport.ops import leftovers

    archive, dst, run_id = world
    gallery.add(archive, dst)
    before = tree_bytes(dst / "gallery")
    assert runs.list_runs("gallery", dst) == []
    assert runs.prune("gallery", set(), dst) == []
    assert leftovers.set_aside(dst, run_id, dst.parent / "aside") == []
    assert leftovers.pruned_leftovers(dst) == []
    assert runs.check_published(chapters.CHAPTERS, dst) == {}
    assert tree_bytes(dst / "gallery") == before
    r = subprocess.run(
        [sys.executable, "-m", "labsupport", "runs"],
        env={**os.environ, "LABSUPPORT_RUNS": str(dst), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "gallery" not in r.stdout, r.stderr


def test_the_repository_gallery_loads():
    """The committed entries: real runs, checked whole, each labelled."""
    found = gallery.entries()
    assert len({e.run.chapter for e in found}) >= 2
    for e in found:
        assert e.manifest.get("label") and e.run.provenance["gpu"]


def test_no_row_beats_its_floor():
    """The committed gallery beside the published runs: a row's step is one that gives the step's
    answers and reads the step's bytes, so none is under its floor; Closing the gap's FP8 rung (a
    floor of its own, and 2.92 ms against the BF16 floor's 3.15 ms in the published run) never
    stands as a row's step."""
    df = gallery_page.rows()
    cg = df[df.chapter == "closing-the-gap"]
    assert len(cg) >= 2 and not cg.step.isin(["fp8-weights", ""]).any()
    timed = df[df["x floor"].notna()]
    assert len(timed) >= 4 and (timed["x floor"] > 1).all(), timed[["chapter", "step", "x floor"]]


def test_a_full_disk_is_not_a_damaged_archive(world, monkeypatch):
    """Writing a file out fails with ENOSPC (every write goes to /dev/full): one line saying so."""
    archive, dst, _ = world
    real_open = open
    monkeypatch.setattr(gallery, "open", lambda path, mode: real_open("/dev/full", "wb"), raising=False)
    with pytest.raises(gallery.GalleryError) as e:
        gallery.add(archive, dst)
    assert str(e.value).startswith("no space left on the device holding ") and "\n" not in str(e.value)
    assert not (dst / "gallery").exists()


def test_a_read_only_runs_folder_is_one_line(world, monkeypatch):
    archive, dst, _ = world

    def read_only(*args, **kw):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(gallery.tempfile, "mkdtemp", read_only)
    with pytest.raises(gallery.GalleryError, match=r"^cannot write under .*gallery \(Read-only file system\)$"):
        gallery.add(archive, dst)
    assert not (dst / "gallery").exists()


def _launch_overhead(tmp_path):
    """A packed launch-overhead run (a step table, a floor) as its archive's members."""
    src = tmp_path / "src"
    run_id = _copy(src, "launch-overhead")
    (src / "published.json").write_text(json.dumps({"launch-overhead": run_id}))
    return members(pack.pack("launch-overhead", root=src, out_dir=tmp_path / "packs")[0]), run_id


def _variants(files, run_id, change):
    rows = list(csv_module.DictReader(io.StringIO(files[f"{run_id}/variants.csv"].decode())))
    for r in rows:
        change(r)
    out = io.StringIO()
    w = csv_module.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return resealed(files, run_id, "variants.csv", out.getvalue().encode())


def _decode_bytes(files, run_id, value):
    meta = json.loads(files[f"{run_id}/meta.json"])
    meta["results"]["model"]["decode_bytes"] = value
    return resealed(files, run_id, "meta.json", json.dumps(meta).encode())


def _busier(r):
    if r["variant"] == "eager":
        r["gpu_busy_ns"] = "9000000000000"  # within its range (1e13 ns), 90,000x the step's span


def _slower(r):
    if r["wall_ms_min"]:
        r["wall_ms_min"] = "9999999"


IMPOSSIBLE = {
    "bytes faster than the datasheet": (lambda f, i: _decode_bytes(f, i, 15e18), "x floor 0.00"),
    "GPU busier than the step": (lambda f, i: _variants(f, i, _busier), "GPU busy "),
    "a step 10x its eager step": (lambda f, i: _variants(f, i, _slower), "more than the 10x"),
    "infinite bytes": (lambda f, i: _decode_bytes(f, i, math.inf), "are inf, not a positive number"),
    "NaN bytes": (lambda f, i: _decode_bytes(f, i, math.nan), "are nan, not a positive number"),
}


@pytest.mark.parametrize("kind", list(IMPOSSIBLE))
def test_a_run_whose_numbers_contradict_each_other_is_refused_and_never_shown(tmp_path, monkeypatch, kind):
    """Refused by `add` in one line naming the run and the number; placed by hand, left off the
    page with a line saying why. (validate.check_run, tested above, is left out: seconds a run.)"""
    from labsupport.ops import validate

    monkeypatch.setattr(validate, "check_run", lambda ch, run, *a: [])
    files, run_id = _launch_overhead(tmp_path)
    change, expected = IMPOSSIBLE[kind]
    bad = change(files, run_id)
    dst = tmp_path / "runs"
    dst.mkdir()
    (dst / "published.json").write_text("{}")
    with pytest.raises(gallery.GalleryError) as e:
        gallery.add(write(tmp_path / "bad.tar.gz", bad), dst)
    line = str(e.value)
    assert f"run {run_id} of launch-overhead: " in line and expected in line and "\n" not in line, line
    assert not (dst / "gallery").exists()
    placed = dst / "gallery" / "nvidia-h200" / "launch-overhead" / run_id
    placed.mkdir(parents=True)
    for name, data in bad.items():
        (placed / name.split("/", 1)[1]).write_bytes(data)
    shown = gallery_page.gather(dst)
    assert shown.rows.empty and expected in shown.left_out["launch-overhead"][0]
    page = gallery_page.html(shown)
    assert "<table" not in page and "Left out: run " in page


def test_a_download_name_fits_a_file_name():
    long_id = "20261130T064513Z-" + "x" * 240
    e = gallery.Entry("nvidia-h200", runs.Run(CHAPTER, long_id, REPO, {}))
    name = gallery_page.download_name(e)
    assert len(name.encode()) <= 255 and name.startswith(f"{CHAPTER}-") and name.endswith("-nvidia-h200.zip")
    short = gallery.Entry("nvidia-h200", runs.Run(CHAPTER, "20261130T064513Z-h200", REPO, {}))
    assert gallery_page.download_name(short) == f"{CHAPTER}-20261130T064513Z-h200-nvidia-h200.zip"


def test_the_nightly_book_holds_the_gallery_as_it_stands(world, tmp_path, monkeypatch):
    """nightly.build_book stages the gallery beside the runs it publishes: the book it builds
    shows the same gallery runs, byte for byte (only their own files)."""
    from labsupport.ops import bookbuild, nightly

    archive, dst, run_id = world
    shutil.copytree(FIXTURES / CHAPTER / run_id, dst / CHAPTER / run_id)
    (dst / "published.json").write_text(json.dumps({CHAPTER: run_id}))
    gallery.add(archive, dst)
    staged = {}

    def build(runs_root, **kw):
        staged.update(tree_bytes(runs_root / "gallery"))
        return tmp_path / "html"

    monkeypatch.setattr(bookbuild, "build", build)
    nightly.build_book(dst, {CHAPTER: run_id}, {}, tmp_path / "night")
    assert staged and staged == tree_bytes(dst / "gallery")
