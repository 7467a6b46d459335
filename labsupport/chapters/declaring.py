"""What a chapter declares about itself, in its folder (labsupport/chapters/<slug>/declaration.py):
one File per file its runs may hold (what it holds in one line, the columns the analysis reads,
the range of its numbers, the cells that may be empty), its Params (each field with its own
check, smoke and CPU values: `param`), the other chapters' runs it reads and the GPUs it needs.
A run's tables are checked against the declaration when written and when loaded (the runs layer
is handed it), `--param` values against the fields' checks."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from labsupport import runs
from labsupport.chapters.rules import Rule, between, each_between, one_of
from labsupport.chapters.table_keys import KEYS, SHARED
from labsupport.runs.provenance import REPO_ROOT

# The one declaration of what a number in a run may be (finite always, and within these bounds),
# by column name, first match wins; a File's `ranges` overrides it per column. Times are never
# negative and below 1e7 ms (about three hours); start/end stamps may be any non-negative stamp;
# counts, bytes and rates are never negative.
RANGES = (
    ("start_ns", (0, 1e19)),
    ("end_ns", (0, 1e19)),
    ("*_ns", (0, 1e13)),
    ("*_ns_*", (0, 1e13)),
    ("*_us", (0, 1e10)),
    ("*_us_*", (0, 1e10)),
    ("*us_median", (0, 1e10)),
    ("* µs", (0, 1e10)),
    ("*_ms", (0, 1e7)),
    ("*_ms_*", (0, 1e7)),
    ("*ms_median", (0, 1e7)),
    ("* ms", (0, 1e7)),
    ("kernels", (0, 1e9)),
    ("*bytes", (0, 1e16)),
    ("*tbs", (0, 1e4)),
    ("*tflops", (0, 1e6)),
    ("GB/s", (0, 1e7)),
    ("TB/s", (0, 1e4)),
)

# Columns of every file that may have empty cells: CUDA-event times of a run on a CPU (there are no events).
MAY_LACK = ("gpu_ms",)

KERNELS = ("name", "start_ns", "end_ns", "dur_ns", "op", "module", "kind")
KERNELS_BY_LAYER = KERNELS + ("short_name", "layer", "part")
CEILINGS = ("copy_bytes", "copy_ms_median", "gemm_n", "gemm_ms_median", "copy_tbs", "gemm_tflops")
NOTEBOOK_TIMEOUT_S = 3600  # a chapter's default `timeout_s`: 8x the slowest in history.csv (7 min)
# The checks most chapters' parameters share.
REPEATS = between(1, 10_000)
TOKENS = between(1, 1 << 17)  # a prompt's tokens: more than any preset's context
LENGTHS = each_between(1, 1 << 17)  # a sweep's contexts or prompt lengths, in tokens
BATCH = between(1, 1024)
# The half-precision type of a chapter's model (labsupport.measure.models.DTYPES); a run without
# the parameter ran in bfloat16.
DTYPE = one_of("bfloat16", "float16")
DEVICE = one_of("cuda", "cpu")  # "cpu" only with a tiny preset (the tests; recording.writer refuses it else)

# The line on ceilings.csv, a file of most chapters' runs.
CEILINGS_LINE = (
    "the GPU's measured copy (bytes read plus written), read-stream and BF16 matrix-multiply rates; the read "
    "stream counts towards the practical ceiling, the copy never"
)
_UNSET = object()


class UnknownParameter(TypeError):
    """A parameter a chapter's Params has no field for (the message is one line naming the known ones)."""


class _NamedFieldsOnly(type):
    """Params(**overrides) with a name Params has no field for stops in one line naming its fields
    (a dataclass's own error would be a bare "unexpected keyword argument")."""

    def __call__(cls, *args, **kwargs):
        known = [f.name for f in fields(cls)]
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            chapter = cls.__module__.split(".")[2].replace("_", "-")  # labsupport.chapters.<package>.declaration
            raise UnknownParameter(f"{unknown[0]!r} is not a parameter of {chapter} (parameters: {', '.join(known)})")
        return super().__call__(*args, **kwargs)


class Parameters(metaclass=_NamedFieldsOnly):
    """The base of every chapter's Params (a dataclass of `param` fields)."""


def param(default, *, check: Rule | None = None, smoke=_UNSET, cpu=_UNSET):
    """A field of a chapter's Params: its default (what the notebook runs with), the check a
    `--param` value must pass, its smallest value for `live --smoke`, its value on a CPU with the
    tiny model (the tests). A list default is copied for each instance."""
    meta = {"check": check}
    meta.update({k: v for k, v in (("smoke", smoke), ("cpu", cpu)) if v is not _UNSET})
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class File:
    """A file a chapter's runs may hold. `name` is a file name, or a pattern of a family of files
    with {placeholders} (`trace-tp{tp}-rank{rank}-eager.json.gz`) that `describes` may use too."""

    name: str
    describes: str  # one line: what it holds (the chapter's closing list of data)
    columns: tuple[str, ...] = ()  # the columns the analysis reads (a table may have more)
    ranges: dict = field(default_factory=dict, hash=False)  # {column: (lo, hi)}, over RANGES
    # Column patterns whose cells may be empty in a row that has no status column or an "ok" one:
    # a number this form was not measured for (a form timed by another chapter, a quartile of a
    # single span); everywhere else an empty cell is refused.
    may_lack: tuple[str, ...] = ()
    required: bool = False  # every run of the chapter holds it

    def match(self, name: str) -> dict | None:
        """{placeholder: text} when `name` is this file (or one of its family), else None."""
        if "{" not in self.name:
            return {} if name == self.name else None
        parts = re.split(r"\{(\w+)\}", self.name)
        regex = "".join(
            re.escape(p) if i % 2 == 0 else f"(?P<{p}>[0-9A-Za-z]+(?:-[0-9A-Za-z]+)*?)" for i, p in enumerate(parts)
        )
        m = re.fullmatch(regex, name)
        return m.groupdict() if m else None


# ceilings.csv as most chapters' runs hold it: the GPU's measured rates, in one row.
CEILINGS_FILE = File("ceilings.csv", CEILINGS_LINE, CEILINGS)


@dataclass(frozen=True)
class Chapter:
    slug: str  # also the folder under runs/
    files: tuple[File, ...]
    params: type  # the chapter's Params dataclass: every notebook parameter, with its default and checks
    reads: tuple[str, ...] = ()  # other chapters whose published runs this chapter's notebook reads
    gpus: int = 1  # GPUs its live run needs: the nightly skips it, in one line, on a box with fewer
    timeout_s: int = NOTEBOOK_TIMEOUT_S  # the longest its notebook may run live (live.run_chapter)
    # path from the repository root: notebooks/ and the slug with underscores, unless given (a test's scratch one)
    notebook: str = ""

    def __post_init__(self):
        if not self.notebook:
            object.__setattr__(self, "notebook", f"notebooks/{self.slug.replace('-', '_')}.ipynb")

    def file(self, name: str) -> tuple[File, dict] | None:
        """The declared file `name` is (the first that matches) and its placeholders, or None."""
        for f in self.files:
            got = f.match(name)
            if got is not None:
                return f, got
        return None

    @property
    def artifacts(self) -> tuple[str, ...]:
        """The files every run of the chapter must contain."""
        return tuple(f.name for f in self.files if f.required)

    def columns_of(self, name: str) -> tuple[str, ...]:
        """The columns table `name` must have (none for an undeclared file)."""
        found = self.file(name)
        return found[0].columns if found else ()

    def describe(self, name: str) -> str | None:
        """The line on file `name` of the chapter's runs, or None."""
        found = self.file(name)
        if not found:
            return None
        return found[0].describes.format(**found[1]) if found[1] else found[0].describes

    def range_of(self, file: str, column: str) -> tuple[float, float] | None:
        """The values a numeric column may hold (None: not a checked column): the file's own
        `ranges` entry, else the first of RANGES matching the column's name."""
        found = self.file(file)
        if found and column in found[0].ranges:
            return found[0].ranges[column]
        return next((r for pattern, r in RANGES if fnmatch.fnmatchcase(column, pattern)), None)

    def lacks_allowed(self, file: str, column: str) -> bool:
        """Whether an empty cell in `column` of `file` means "not measured here" (File.may_lack)."""
        found = self.file(file)
        patterns = (*(found[0].may_lack if found else ()), *MAY_LACK)
        return any(fnmatch.fnmatchcase(column, p) for p in patterns)

    def key_of(self, file: str) -> tuple[str, ...] | None:
        """The columns no two rows of `file` may share (chapters.table_keys; None: no key)."""
        key = KEYS.get(self.slug, {}).get(file, SHARED.get(file))
        return None if key is None else tuple(key.split())

    def _per_field(self, key: str) -> dict:
        return {f.name: f.metadata[key] for f in fields(self.params) if f.metadata.get(key, _UNSET) is not _UNSET}

    @property
    def defaults(self) -> dict:
        """{parameter: default}: what the notebook runs with when nothing is overridden."""
        return {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(self.params)}

    @property
    def checks(self) -> dict:
        """{parameter: Rule} for every parameter with a check."""
        return {k: v for k, v in self._per_field("check").items() if v is not None}

    @property
    def smoke(self) -> dict:
        """The smallest parameters, for `live --smoke`."""
        return self._per_field("smoke")

    @property
    def cpu(self) -> dict:
        """The parameters on a CPU with the tiny model (the tests); empty: no CPU path."""
        return self._per_field("cpu")

    @property
    def module(self) -> str:
        """The chapter's package under labsupport.chapters: named like its notebook and its run folder."""
        return Path(self.notebook).stem

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.notebook

    def load(self, run_id: str | None = None, root: Path | None = None, verify: bool = True):
        """The chapter's published run (or `run_id`), loaded and checked whole against this declaration."""
        return runs.load_run(self, run_id, root, verify)

    def progress(self, msg: str) -> None:
        """A line of the live recording's log, naming the chapter."""
        print(f"[{self.slug}] {msg}", flush=True)
