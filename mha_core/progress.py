"""The one progress signature of the library.

Every long call (loading a model, a run layer by layer, profiling a corpus, training in the lab)
takes ``progress=None`` or a callable ``progress(done, total, message)``:

    done     how much is finished (a count: layers, sentences, shards, steps; or a fraction with total 1)
    total    how much there is in all (> 0)
    message  what is happening, in words a user can read ("" when there is nothing to add)

A progress callable may raise to stop the work (the app raises when the visitor's session has gone
away or asked for something else); the library lets the exception through and leaves no partial
result behind (a corpus profile keeps the shards it finished in its cache, each a whole file, so
that the same call resumes from them).
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def __call__(self, done: float, total: float, message: str = "") -> None: ...


def report(progress: Progress | None, done: float, total: float, message: str = "") -> None:
    """Call ``progress`` if there is one."""
    if progress is not None:
        progress(done, total, message)


def fraction(done: float, total: float) -> float:
    """``done / total`` clipped to [0, 1] (0 when total is not positive)."""
    return min(1.0, max(0.0, float(done) / float(total))) if total and total > 0 else 0.0


def progress_part(progress: Progress | None, index: int, parts: int) -> Progress | None:
    """``progress`` for part ``index`` of ``parts`` equal parts of one job (e.g. two passes of a run)."""
    if progress is None:
        return None
    return lambda done, total, message="": progress(index + done / total, parts, message)
