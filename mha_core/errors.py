"""Exceptions a user can act on. The app shows their message; it never shows a traceback."""

import re


class HeadscopeError(Exception):
    """Base class of every error Headscope raises on purpose."""


class InputTextError(HeadscopeError, ValueError):
    """The text cannot be run: empty, whitespace only, or not a string."""


class EmptyTextError(InputTextError):
    """The text holds nothing the model reads: blank, invisible characters only, or characters its tokenizer
    drops (accents alone, control characters), so it becomes no token but the model's special ones.
    ``what`` names the input: "text", "pair text" or "word"."""

    def __init__(self, message: str, what: str = "text"):
        super().__init__(message)
        self.what = what


class ModelLoadError(HeadscopeError):
    """The model cannot be loaded: unknown id, no network and not cached, not a checkpoint, no attention weights."""


class EngineNotSupported(HeadscopeError):
    """The from-scratch engine does not implement this model family."""


# ---- message hygiene -------------------------------------------------------------------------------
# Absolute paths (POSIX, ~/..., Windows drive letters) inside a message, e.g. from a transformers error.
_PATH = re.compile(r"(?<![\w.:/-])(?:~|[A-Za-z]:)?(?:[\\/][^\s'\"`<>|:;,()\[\]{}]+)+[\\/]?")


def quoted(text, limit: int = 200) -> str:
    """``repr`` of user input for a message, cut to ``limit`` characters (a 100,000-character URL
    parameter must not become a 200,000-character message)."""
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def redact_paths(text: str, keep: tuple[str, ...] = ()) -> str:
    """``text`` with every absolute path of this machine replaced by ``<path>``, except the strings in
    ``keep`` (e.g. a folder the user typed, which they already know)."""
    text = str(text)
    placeholders = {}
    for index, kept in enumerate(k for k in keep if k):
        marker = f"\x00{index}\x00"
        placeholders[marker] = kept
        text = text.replace(kept, marker)
    text = _PATH.sub("<path>", text)
    for marker, kept in placeholders.items():
        text = text.replace(marker, kept)
    return text
