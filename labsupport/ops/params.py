"""Notebook parameters given on the command line (`--param NAME=VALUE`), checked before
anything runs, into the `overrides` the notebook's parameters cell receives.

A name must be a field of a selected chapter's Params (labsupport/chapters/<package>/declaration.py);
`mode`, `run_id` and `overrides` are set by the command, never by hand. A value is JSON (a bare
word is allowed for a parameter whose default is a string), of the default's type, and passes the
field's check. Each problem is one ParamError line naming the parameter.
"""

from __future__ import annotations

import json
import math
import re

from labsupport import chapters
from labsupport.chapters import rules

RESERVED = {
    "mode": "the command sets it",
    "run_id": "the command chooses the run id",
    "overrides": "give each parameter as --param NAME=VALUE",
}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched in full


class ParamError(ValueError):
    """A `--param` that cannot be used (the message is one line naming it)."""


def parse_cli(pairs: list[str]) -> dict[str, str]:
    """`NAME=VALUE` strings to {name: raw value} (values are parsed per chapter later)."""
    out = {}
    for p in pairs:
        name, eq, value = p.partition("=")
        if not eq or not NAME.fullmatch(name):
            raise ParamError(f"--param {p!r}: expected NAME=VALUE, e.g. --param repeats=20")
        out[name] = value  # given twice: the last one counts
    return out


def _type_name(v) -> str:
    return {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a JSON list",
        dict: "a JSON object",
    }.get(type(v), type(v).__name__)


def parse_value(name: str, raw, default):
    """The value of `--param name=raw`, of the type of the parameter's `default`."""
    if not isinstance(raw, str):
        value = raw  # already a Python value (smoke and CPU overrides)
    elif isinstance(default, str):
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if not isinstance(value, str):
            value = raw  # a bare word such as 123 for a string parameter is that string
    else:
        try:
            value = json.loads(raw)
        except ValueError:
            raise ParamError(
                f"--param {name}={raw}: not a JSON value (the default is {json.dumps(default)}, {_type_name(default)})"
            ) from None
    _check_type(name, value, default)
    return float(value) if isinstance(default, float) else value


def _is(value, like) -> bool:
    if isinstance(like, bool):
        return isinstance(value, bool)
    if isinstance(like, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(like, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(like))


def _check_type(name: str, value, default) -> None:
    if default is None:
        return
    if not _is(value, default):
        raise ParamError(
            f"--param {name}={json.dumps(value)}: must be {_type_name(default)}, like the default {json.dumps(default)}"
        )
    if isinstance(default, list) and default:
        kinds = {type(x) for x in default}
        if len(kinds) == 1:
            bad = [x for x in value if not _is(x, default[0])]
            if bad:
                raise ParamError(
                    f"--param {name}={json.dumps(value)}: every entry must be "
                    f"{_type_name(default[0])} ({json.dumps(bad[0])} is not)"
                )


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_rule(name: str, value, rule: rules.Rule) -> None:
    """Apply one of chapters.py's rules."""
    shown = f"--param {name}={json.dumps(value)}"
    if rule.kind == "between":
        lo, hi = rule.arg
        if not (_number(value) and lo <= value <= hi):  # NaN is within no bounds
            raise ParamError(f"{shown}: must be a number from {lo} to {hi}")
    if rule.kind in ("each_between", "subset_of") and len(value) > rules.MAX_ENTRIES:
        raise ParamError(f"--param {name}: {len(value)} entries, more than the {rules.MAX_ENTRIES} allowed")
    if rule.kind == "each_between":
        lo, hi = rule.arg
        if not value:
            raise ParamError(f"{shown}: must not be empty")
        bad = [x for x in value if not (_number(x) and lo <= x <= hi)]
        if bad:
            raise ParamError(f"{shown}: every entry must be a number from {lo} to {hi} ({json.dumps(bad[0])} is not)")
    if rule.kind == "one_of" and value not in rule.arg:
        raise ParamError(f"{shown}: must be one of {', '.join(map(str, rule.arg))}")
    if rule.kind == "subset_of":
        bad = [x for x in value if x not in rule.arg]
        if bad:
            raise ParamError(f"{shown}: {json.dumps(bad[0])} is not one of {', '.join(map(str, rule.arg))}")
        if len(set(value)) < len(value):
            raise ParamError(f"{shown}: an entry is given twice")
    if rule.kind == "preset":
        from labsupport.measure import models

        allowed = rule.arg or tuple(models.PRESETS)
        if value not in allowed:
            raise ParamError(f"{shown}: unknown model preset {value!r} (known: {', '.join(allowed)})")
    if rule.kind == "model_folder" and value:
        from pathlib import Path

        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise ParamError(f"{shown}: {folder} is not a folder (a model folder holds a transformers config.json)")
        if not (folder / "config.json").is_file():
            raise ParamError(f"{shown}: {folder} is not a model folder: it has no config.json")


def for_chapter(chapter: chapters.Chapter, given: dict) -> dict:
    """The overrides to run `chapter` with: those of `given` that its Params has, parsed and
    checked (`given` may hold raw strings from the command line or Python values)."""
    defaults = chapter.defaults
    out = {}
    for name, raw in given.items():
        if name in RESERVED:
            raise ParamError(f"--param {name}: not a parameter you may set ({RESERVED[name]})")
        if name not in defaults:
            continue
        value = parse_value(name, raw, defaults[name])
        if name in chapter.checks:
            check_rule(name, value, chapter.checks[name])
        out[name] = value
    return out


# The nightly's options: a relative change (0.25 is 25%) and a count of kernels.
TIMING_THRESHOLD = (0.0, 10.0)  # exclusive bounds
MIN_KERNELS = (1, 100_000)  # a decode step launches about a thousand kernels


def timing_threshold(raw) -> float:
    """`--timing-threshold`: a finite number above 0 and below 10, else one ParamError line."""
    lo, hi = TIMING_THRESHOLD
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not lo < value < hi:  # NaN and infinities are outside
        raise ParamError(f"--timing-threshold {raw}: must be a number above {lo:g} and below {hi:g} (0.25 is 25%)")
    return value


def min_kernels(raw) -> int:
    """`--min-kernels`: a whole number from 1 to 100000, else one ParamError line."""
    lo, hi = MIN_KERNELS
    try:
        value = int(raw) if not isinstance(raw, (bool, float)) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not lo <= value <= hi:
        raise ParamError(f"--min-kernels {raw}: must be a whole number from {lo} to {hi}")
    return value


def resolve(selected: list[chapters.Chapter], given: dict) -> dict[str, dict]:
    """{chapter slug: overrides} for the selected chapters; every name in `given` must be a
    parameter of at least one of them."""
    for name in given:
        if name in RESERVED:
            raise ParamError(f"--param {name}: not a parameter you may set ({RESERVED[name]})")
        if not any(name in ch.defaults for ch in selected):
            known = sorted({n for ch in selected for n in ch.defaults})
            where = selected[0].slug if len(selected) == 1 else "the selected chapters"
            raise ParamError(f"--param {name}: no such parameter of {where} (parameters: {', '.join(known)})")
    return {ch.slug: for_chapter(ch, given) for ch in selected}
