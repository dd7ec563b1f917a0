"""What the model benchmarks share: their command line (``parser``: the module's docstring as its help, and
``--threads``), the torch threads it asks for (``parsed``), one timed call (``seconds``) and the line that says what
ran them (``machine``: the same code measured 12.5 and 18.6 s on two processors of this machine's name)."""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

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


def processor() -> str:
    """The processor's name and its L2 cache a core (Linux; what ``platform`` knows elsewhere)."""
    name = platform.processor() or "unknown processor"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        name = names[0] if names else name
    l2 = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    return f"{name}, L2 {l2.read_text().strip()}" if l2.exists() else name


def machine() -> str:
    """torch's version and threads, the CPUs and the processor, the load average: the head of every table."""
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs ({processor()}), "
        f"load average {load}"
    )
