"""The rules a chapter declares on its notebook's parameters (labsupport.ops.params applies them
to every `--param` before anything runs): every number is bounded above."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_ENTRIES", "Rule", "between", "each_between", "one_of", "model_folder", "preset", "subset_of"]


@dataclass(frozen=True)
class Rule:
    """A check on a parameter's value: kind is 'between' (a number in arg's (lo, hi)), 'each_between'
    (a non-empty list of at most MAX_ENTRIES such numbers), 'one_of' or 'subset_of' (allowed values,
    none repeated). Every number is bounded above: 10^8 repeats would hold a GPU for days."""

    kind: str
    arg: object


MAX_ENTRIES = 64  # the longest list a parameter may hold (a sweep's batch sizes, say)


def between(lo, hi) -> Rule:
    return Rule("between", (lo, hi))


def each_between(lo, hi) -> Rule:
    return Rule("each_between", (lo, hi))


def one_of(*values) -> Rule:
    return Rule("one_of", tuple(values))


def subset_of(*values) -> Rule:
    return Rule("subset_of", tuple(values))


def preset(*names) -> Rule:
    """One of the model presets in labsupport.measure.models (or of `names`, if given)."""
    return Rule("preset", tuple(names))


def model_folder() -> Rule:
    """Empty (the preset runs), or a local folder holding a transformers config.json (the model
    source of labsupport.measure.models.source)."""
    return Rule("model_folder", None)
