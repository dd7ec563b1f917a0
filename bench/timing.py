"""What the model benchmarks share: their command line (``parser``: the module's docstring as its help, and
``--threads``), the torch threads it asks for (``parsed``), and one timed call (``seconds``)."""

from __future__ import annotations

import argparse
import time

import torch


def seconds(function) -> float:
    """Wall-clock seconds of one call of ``function()``."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def parser(doc: str | None, threads: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser with ``--threads`` (torch threads; ``threads``: the default, None: torch's)."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--threads", type=int, default=threads)
    return made


def parsed(made: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments, with torch set to ``--threads`` threads when it is given."""
    args = made.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args
