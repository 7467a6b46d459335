"""`python -m labsupport gallery add <archive>` and `gallery list`: readers' runs, beside the book's.

An archive (written by `pack`) is untrusted input. It is read member by member, never
extracted by tarfile: every member must be a regular file (no link of either kind, no device,
no fifo) named <run id>/<plain name> (no absolute path, no '..', one folder), at most
pack.MAX_FILE_BYTES each, pack.MAX_TOTAL_BYTES in all and pack.MAX_FILES in number; the bytes
are copied out by count, so a header that lies about a size cannot write more. Then every file
must be listed in pack.json and in the run's meta.json with its SHA-256 (none unlisted, none
missing), and the run must load and validate as a run of its chapter does (ops.validate), and
pass the gallery page's own check of what it would show (ops.gallery_row.problems: no control
character in a text, numbers that are finite and agree with each other).

It is staged in a hidden folder of runs/gallery/ and renamed into place at the end, at
runs/gallery/<gpu>/<chapter>/<run id>/ (each GPU folder is a runs folder of its own, so a
gallery run is loaded by the one loader every run goes through: runs.load_run). A bad archive is
one line and leaves nothing behind; so is a folder that cannot be written (a full disk is said
as such, never blamed on the archive). runs/published.json is never read or written here.
"""

from __future__ import annotations

import errno
import gzip
import json
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from labsupport import chapters, runs
from labsupport.ops import gallery_row, pack, validate
from labsupport.runs.writer import sha256

GALLERY = "gallery"
MAX_ARCHIVE_BYTES = pack.MAX_TOTAL_BYTES
CHUNK = 1 << 20
MAX_NAME_BYTES = 255  # a file or folder name, on the filesystems runs/ lives on
UNREADABLE = (tarfile.TarError, EOFError, zlib.error, OSError)  # what reading a damaged archive raises


class GalleryError(RuntimeError):
    """An archive refused, or a gallery that cannot be read (one line)."""


def gallery_root(root: Path | None = None) -> Path:
    return runs.check_real_dir((root or runs.runs_root()) / GALLERY, "gallery")


def shown(text, limit: int = 120) -> str:
    """Text from an archive as a terminal may show it: printable characters only, cut short."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _member_name(m: tarfile.TarInfo, where: str) -> tuple[str, str]:
    name = m.name
    if name.startswith("/") or "\\" in name:
        raise GalleryError(f"{where}: member {shown(name)!r} is an absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise GalleryError(f"{where}: member {shown(name)!r} leaves its folder")
    if len(parts) != 2 or not all(runs.FILE_PATTERN.match(p) for p in parts):
        raise GalleryError(f"{where}: member {shown(name)!r} is not <run id>/<plain file name>")
    return parts[0], parts[1]


def _unpack(archive: Path, dest: Path) -> str:
    """Copy the archive's files into `dest` (a new empty folder), checked; returns the one
    folder name all members share."""
    where = str(archive)
    try:
        st = archive.lstat()
    except OSError as e:
        raise GalleryError(f"{where}: cannot read it ({type(e).__name__})") from None
    if archive.is_symlink() or not archive.is_file():
        raise GalleryError(f"{where} is not a regular file")
    if st.st_size > MAX_ARCHIVE_BYTES:
        raise GalleryError(f"{where} is {st.st_size >> 20} MiB, more than the {MAX_ARCHIVE_BYTES >> 20} MiB allowed")
    top, seen, total = None, set(), 0
    try:
        # The whole compressed stream first: tarfile takes a member header it cannot read, after
        # the first, for the archive's end, so a cut or damaged archive could pass for a short one.
        unpacked = 0
        with gzip.open(archive, "rb") as whole:
            while chunk := whole.read(CHUNK):
                unpacked += len(chunk)
                if unpacked > pack.MAX_TOTAL_BYTES + (pack.MAX_FILES + 2) * 2 * tarfile.BLOCKSIZE:
                    raise GalleryError(f"{where}: its files exceed {pack.MAX_TOTAL_BYTES >> 20} MiB in all")
        with tarfile.open(archive, "r:gz") as tar:
            for count, m in enumerate(tar, 1):
                if count > pack.MAX_FILES:
                    raise GalleryError(f"{where} holds more than {pack.MAX_FILES} members")
                if m.issym() or m.islnk():
                    raise GalleryError(f"{where}: member {shown(m.name)!r} is a link; only regular files are accepted")
                if not m.isreg():
                    raise GalleryError(f"{where}: member {shown(m.name)!r} is not a regular file")
                folder, name = _member_name(m, where)
                if top not in (None, folder):
                    raise GalleryError(f"{where}: members lie in more than one folder ({shown(top)}, {shown(folder)})")
                top = folder
                if name in seen:
                    raise GalleryError(f"{where}: {shown(name)!r} appears twice")
                seen.add(name)
                if m.size > pack.MAX_FILE_BYTES:
                    raise GalleryError(
                        f"{where}: {shown(name)!r} is {m.size >> 20} MiB, more than the "
                        f"{pack.MAX_FILE_BYTES >> 20} MiB a file may be"
                    )
                total += m.size
                if total > pack.MAX_TOTAL_BYTES:
                    raise GalleryError(f"{where}: its files exceed {pack.MAX_TOTAL_BYTES >> 20} MiB in all")
                _copy_out(tar.extractfile(m), m.size, dest / name, where)
    except UNREADABLE as e:
        raise GalleryError(_unreadable(where, e)) from None
    if top is None:
        raise GalleryError(f"{where} holds no files")
    return top


def _copy_out(src, size: int, path: Path, where: str) -> None:
    """`size` bytes of the member `src` into the new file `path`; reading is the archive's
    failure, writing is the disk's (its own line: a full disk is not a damaged archive)."""
    try:
        with open(path, "xb") as out:
            for chunk in _chunks(src, size, where, path.name):
                out.write(chunk)
    except OSError as e:
        raise WriteFailed(e) from None


class WriteFailed(Exception):
    """Writing an archive's file out failed (`args[0]`, an OSError): `add` says it in one line."""


def _chunks(src, size: int, where: str, name: str):
    left = size
    while left > 0:
        try:
            chunk = src.read(min(CHUNK, left))
        except UNREADABLE as e:
            raise GalleryError(_unreadable(where, e)) from None
        if not chunk:
            raise GalleryError(f"{where}: {shown(name)!r} is truncated")
        yield chunk
        left -= len(chunk)


def _unreadable(where: str, e: BaseException) -> str:
    return f"{where} is not a readable .tar.gz archive ({type(e).__name__})"


def _write_error(e: OSError, where: Path) -> str:
    """One line for a failure to write under the gallery (not the archive's fault)."""
    if e.errno == errno.ENOSPC:
        return f"no space left on the device holding {where}"
    if e.errno == errno.ENAMETOOLONG:
        return f"a name is too long for the filesystem holding {where}"
    return f"cannot write under {where} ({e.strerror or type(e).__name__})"


def _check_listed(folder: Path, where: str) -> dict:
    """pack.json and meta.json agree with the files: every file listed in both with its
    SHA-256, none missing, none unlisted. Returns pack.json."""
    try:
        manifest = json.loads((folder / pack.PACK_JSON).read_text())
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError as e:
        raise GalleryError(f"{where} lacks {Path(e.filename).name}") from None
    except (OSError, UnicodeDecodeError, ValueError):
        raise GalleryError(f"{where}: pack.json or meta.json is not JSON") from None
    for key in ("results", "derived"):
        if isinstance(meta, dict) and not isinstance(meta.get(key, {}), dict):
            raise GalleryError(f"{where}: meta.json's {key!r} is not an object")
    if not isinstance(manifest, dict) or manifest.get("format") != pack.FORMAT:
        raise GalleryError(f"{where}: pack.json is not a {pack.FORMAT} manifest")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        raise GalleryError(f"{where}: pack.json or meta.json does not list files")
    present = {p.name for p in folder.iterdir()} - {pack.PACK_JSON}
    wanted = set(listed)
    if present - wanted:
        raise GalleryError(f"{where}: {shown(sorted(present - wanted)[0])!r} is not listed in pack.json")
    if wanted - present:
        raise GalleryError(f"{where}: {shown(sorted(wanted - present)[0])!r} is listed but missing")
    if set(meta["files"]) | {"meta.json"} != wanted:
        raise GalleryError(f"{where}: pack.json and the run's meta.json list different files")
    for name, entry in sorted(listed.items()):
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if sha256(folder / name) != digest or (name != "meta.json" and meta["files"][name] != digest):
            raise GalleryError(f"{where}: {shown(name)!r} does not match its SHA-256")
    for key in ("chapter", "run_id"):
        if manifest.get(key) != meta.get(key):
            raise GalleryError(f"{where}: pack.json and meta.json disagree on the {key}")
    return manifest


def add(archive: Path, root: Path | None = None) -> str:
    """Check `archive` and file it under runs/gallery/; returns a one-line summary. Anything
    wrong is one GalleryError and nothing is left behind."""
    archive = Path(archive)
    try:
        top = gallery_root(root)
    except runs.RunError as e:
        raise GalleryError(str(e)) from None
    made = not top.exists()
    try:
        top.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".incoming-", dir=top))
    except OSError as e:
        if made:
            shutil.rmtree(top, ignore_errors=True)
        raise GalleryError(_write_error(e, top)) from None
    done = False
    try:
        run, dest = _file(archive, stage, top)
        done = True
    except (OSError, WriteFailed) as e:  # the archive's own failures are GalleryErrors by now: the disk's
        raise GalleryError(_write_error(e.args[0] if isinstance(e, WriteFailed) else e, top)) from None
    except runs.RunError as e:  # a folder of the gallery that is a link
        raise GalleryError(str(e)) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not done:
            shutil.rmtree(top, ignore_errors=True)  # the gallery folder this call made, empty again
    f = pack.form(run)
    return (
        f"added {run.chapter} run {run.run_id} ({shown(f['gpu'])}, {shown(f['dtype'])}, {shown(f['preset'])}) -> {dest}"
    )


def _file(archive: Path, stage: Path, top: Path) -> tuple[runs.Run, Path]:
    """Unpack `archive` into `stage`, check it, and move its run into the gallery."""
    where = str(archive)
    unpacked = stage / "unpacked"
    unpacked.mkdir()
    folder = _unpack(archive, unpacked)
    manifest = _check_listed(unpacked, where)
    try:
        chapter = runs.check_chapter(manifest["chapter"], where)
        run_id = runs.check_run_id(manifest["run_id"], where)
        ch = chapters.by_slug(chapter)
    except (runs.RunError, KeyError, LookupError):
        raise GalleryError(f"{where}: {shown(manifest.get('chapter'))!r} is not a chapter of this book") from None
    if folder != run_id:
        raise GalleryError(f"{where}: its folder {shown(folder)!r} is not its run id")
    if len(run_id.encode()) > MAX_NAME_BYTES:
        raise GalleryError(f"{where}: its run id is {len(run_id)} characters, more than a folder's name may be")
    staged_root = stage / "runs"
    (staged_root / chapter).mkdir(parents=True)
    unpacked.rename(staged_root / chapter / run_id)
    try:
        run = runs.load_run(ch, run_id, staged_root)
        problems = validate.check_run(ch, run)
        # What the gallery page would show of it: its texts and numbers, as the page checks them.
        problems += gallery_row.problems(gallery_row.row(run, gallery_row.source(manifest.get("label")), ""))
    except runs.RunError as e:
        problems = [str(e)]
    if problems:
        raise GalleryError(f"{where}: {shown(problems[0].replace(str(staged_root), '<archive>'), 300)}")
    slug = pack.gpu_slug(run.provenance.get("gpu"))
    dest = runs.check_real_dir(top / slug, "gallery") / chapter / run_id
    runs.check_real_dir(dest.parent, "gallery")
    if dest.exists():
        raise GalleryError(f"{where}: run {run_id} of {chapter} on {shown(slug)} is already in the gallery")
    made = [d for d in (top / slug, dest.parent) if not d.exists()]
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        (staged_root / chapter / run_id).rename(dest)
    except OSError:
        for d in reversed(made):  # the folders made for it, empty again
            shutil.rmtree(d, ignore_errors=True)
        raise
    return run, dest


@dataclass
class Entry:
    """A run of the gallery: the GPU folder it is filed under, and the run (loaded checked)."""

    gpu_slug: str
    run: runs.Run

    @property
    def manifest(self) -> dict:
        try:
            return json.loads((self.run.path / pack.PACK_JSON).read_text())
        except (OSError, ValueError):
            return {}


def entries(root: Path | None = None, verify: bool = True) -> list[Entry]:
    """Every run of the gallery, each loaded checked; a damaged one is a RunError naming it."""
    top = gallery_root(root)
    if not top.is_dir():
        return []
    out = []
    for gpu_dir in sorted(p for p in top.iterdir() if not p.name.startswith(".")):
        if gpu_dir.is_symlink() or not gpu_dir.is_dir() or not runs.CHAPTER_PATTERN.match(gpu_dir.name):
            raise runs.RunError(f"{gpu_dir} is not a GPU folder of the gallery (a real folder, lower-case name)")
        for ch in chapters.CHAPTERS:
            for run_id in runs.list_runs(ch.slug, gpu_dir):
                out.append(Entry(gpu_dir.name, runs.load_run(ch, run_id, gpu_dir, verify=verify)))
    return out


def listing(root: Path | None = None) -> list[str]:
    """One line per gallery run, its text made safe to print."""
    lines = []
    for e in entries(root):
        f = pack.form(e.run)
        lines.append(
            f"{e.run.chapter}  {e.run.run_id}  {shown(f['gpu'])}  {shown(f['dtype'])}  {shown(f['preset'])}  "
            f"{shown(e.run.provenance.get('utc_time', ''))}"
        )
    return lines or ["the gallery is empty"]


def files(e: Entry) -> list[str]:
    """A gallery run's own files: those its meta.json lists, meta.json, and pack.json if there."""
    return [
        *sorted(e.run.meta["files"]),
        "meta.json",
        *([pack.PACK_JSON] if (e.run.path / pack.PACK_JSON).is_file() else []),
    ]


def copy_to(dst: Path, root: Path | None = None) -> list[Entry]:
    """The gallery as it stands, into the runs folder `dst` (dst/gallery/...): each run loaded
    checked (a damaged one is the RunError naming it), only its own files, never a link."""
    found = entries(root)
    for e in found:
        target = dst / GALLERY / e.gpu_slug / e.run.chapter / e.run.run_id
        target.mkdir(parents=True)
        for name in files(e):
            src = e.run.path / name
            if src.is_symlink() or not src.is_file():
                raise runs.RunError(f"{src} is not a regular file; refusing to copy it")
            shutil.copyfile(src, target / name)
    return found
