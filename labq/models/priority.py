"""Priority classes: named levels on one integer scale.

A job's priority is an integer; the four classes are names for points on that
scale, so an admin can slot a job between classes (``250``) without a new name.
Higher runs first and may preempt strictly lower.
"""

from __future__ import annotations

from enum import IntEnum


class PriorityClass(IntEnum):
    LOW = 100  #: scavenger work: runs when GPUs are idle, first to be preempted
    NORMAL = 200  #: the default for everyone
    HIGH = 300  #: a deadline is near
    URGENT = 400  #: needs GPUs now; preempts anything lower


MIN_PRIORITY = 0
MAX_PRIORITY = 1000


def parse_priority(text: str | int) -> int:
    """``"high"`` -> 300, ``"250"`` -> 250; raises ValueError saying what is accepted."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        word = str(text).strip().lower()
        try:
            return int(PriorityClass[word.upper()])
        except KeyError:
            pass
        try:
            value = int(word)
        except ValueError:
            raise ValueError(
                f"unknown priority {text!r}: use low, normal, high, urgent "
                f"or an integer {MIN_PRIORITY}-{MAX_PRIORITY}"
            ) from None
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"priority {value} is out of range {MIN_PRIORITY}-{MAX_PRIORITY}")
    return value


def priority_name(value: int) -> str:
    """300 -> ``"high"``; 250 -> ``"250"``."""
    try:
        return PriorityClass(value).name.lower()
    except ValueError:
        return str(value)


def class_of(value: int) -> PriorityClass:
    """The named class a priority falls in: the highest at or below it (250 is normal; below low is low)."""
    for klass in sorted(PriorityClass, reverse=True):
        if value >= klass:
            return klass
    return PriorityClass.LOW
