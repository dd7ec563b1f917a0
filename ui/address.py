"""Values read from a page address, checked one way for each kind of setting. Plain Python (no Streamlit).

A link is text anyone can write, so every value a page takes from it goes through one of these parsers;
each returns the setting's value or raises ``ValueError`` whose message says what the setting takes
(shown as "the link's x=... is not <message>"). Numbers are ASCII digits only, with an optional minus
sign, at most ``MAX_DIGITS`` of them: ``str.isdigit`` accepts a superscript two that ``int`` refuses, and
``int`` itself accepts other scripts' digits, ``_`` separators, a plus sign and surrounding spaces.
"""

from __future__ import annotations

import re

MAX_DIGITS = 9
LARGEST = 10**MAX_DIGITS - 1  # the largest number a link may hold, for settings without their own bound
_WHOLE_NUMBER = re.compile(rf"-?[0-9]{{1,{MAX_DIGITS}}}")
NONE = "none"  # a list setting with nothing chosen (an empty value would drop the setting from the link)
_SHOWN_CHOICES = 8  # a message names at most this many of the values a setting takes


def whole_number(raw: str, minimum: int = 0, maximum: int = LARGEST) -> int:
    """``raw`` as an integer from ``minimum`` to ``maximum``: ASCII digits, an optional leading minus."""
    if not isinstance(raw, str) or not _WHOLE_NUMBER.fullmatch(raw):
        raise ValueError(f"a whole number from {minimum} to {maximum}")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise ValueError(f"a whole number from {minimum} to {maximum}")
    return value


def number(minimum: int, maximum: int = LARGEST):
    """A parser of whole numbers from ``minimum`` to ``maximum``."""
    return lambda raw: whole_number(raw, minimum, maximum)


def _described(options) -> str:
    names = [str(option) for option in options]
    shown = ", ".join(names[:_SHOWN_CHOICES]) + (", ..." if len(names) > _SHOWN_CHOICES else "")
    return f"one of {shown}"


def choice(options):
    """A parser of one of ``options``, written in the link as ``str(option)`` (numbers and names alike)."""
    options = list(options)
    by_text = {str(option): option for option in options}

    def parse(raw: str):
        if raw not in by_text:
            raise ValueError(_described(options))
        return by_text[raw]

    return parse


def choices(options):
    """A parser of several of ``options``, written as ``str(option)`` joined by commas (``NONE``: none);
    each at most once, in the link's order."""
    options = list(options)
    one = choice(options)

    def parse(raw: str) -> list:
        if raw == NONE:
            return []
        parts = raw.split(",")
        if len(parts) > len(options) or len(set(parts)) != len(parts):
            raise ValueError(f"a list of different values, each {_described(options)}")
        return [one(part) for part in parts]

    return parse


def format_choices(values) -> str:
    """``choices``' link text of ``values``."""
    return ",".join(str(value) for value in values) if len(values) else NONE


def flag(raw: str) -> bool:
    """On or off, written as 1 or 0."""
    if raw not in ("0", "1"):
        raise ValueError("1 (on) or 0 (off)")
    return raw == "1"


def format_flag(value: bool) -> str:
    return "1" if value else "0"
