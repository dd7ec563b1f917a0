"""Benchmark: the from-scratch core against torch.nn.MultiheadAttention on CPU.

d_model = 768 and 384, 12 heads, batch 1, n in {64, 256, 1024}. The contestants, timed in one run, interleaved
round by round so that machine load hits them alike, all under torch.inference_mode:

  core          mha_core.MultiHeadAttention, returns output and per-head weights (no hooks: the path every layer
                of the from-scratch engine takes)
  torch+w       nn.MultiheadAttention(need_weights=True, average_attn_weights=False)
  torch         nn.MultiheadAttention(need_weights=False) (fused scaled_dot_product_attention)
  before        (with --compare PATH) the MultiHeadAttention of another checkout's mha_core/attention.py, a file
                that imports only torch (e.g. a worktree of main: the same weights, the code before a change)

Prints, for each of ``--runs`` sittings, a markdown table of medians and the ratios core / torch+w (goal <= 1.0),
core / torch (goal <= 1.10) and core / before, then the range of each ratio over the sittings, and the load
average. ``--cpu`` (with ``--threads 1``) times the thread's CPU time instead of the wall clock: on a crowded machine
the other processes' time is then left out (their effect on caches and memory bandwidth is not).
Usage: python -m bench.core [--rounds N] [--threads T] [--runs R] [--compare PATH] [--lengths N ...] [--cpu]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn

import mha_core as mc
from bench.timing import machine

CONFIGS = ((768, 12), (384, 12))
LENGTHS = (64, 256, 1024)


def load_other(path: str):
    """``MultiHeadAttention`` from another checkout's ``mha_core/attention.py``, imported as a module of a package
    ``other_mha_core`` on that checkout's folder (its relative imports come from there; its ``__init__`` is not run)."""
    for name in [name for name in sys.modules if name.split(".")[0] == "other_mha_core"]:
        del sys.modules[name]  # another checkout loaded before
    package = types.ModuleType("other_mha_core")
    package.__path__ = [str(Path(path) / "mha_core")]
    sys.modules["other_mha_core"] = package
    return importlib.import_module("other_mha_core.attention").MultiHeadAttention


def contestants(reference: nn.MultiheadAttention, other=None):
    core = mc.MultiHeadAttention.from_torch(reference).eval()
    runners = {
        "core": lambda x: core(x),
        "torch+w": lambda x: reference(x, x, x, need_weights=True, average_attn_weights=False),
        "torch": lambda x: reference(x, x, x, need_weights=False),
    }
    if other is not None:
        before = other.from_torch(reference).eval()
        runners["before"] = lambda x: before(x)
    return runners


def measure(d_model: int, heads: int, n: int, rounds: int, other=None, clock=time.perf_counter) -> dict[str, float]:
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    runners = contestants(reference, other)
    x = torch.randn(1, n, d_model)
    times = {name: [] for name in runners}
    with torch.inference_mode():
        core_out, core_weights = runners["core"](x)
        ref_out, ref_weights = runners["torch+w"](x)
        # A benchmark of wrong answers is worthless: check agreement first.
        assert torch.allclose(core_out, ref_out, atol=1e-4) and torch.allclose(core_weights, ref_weights, atol=1e-5)
        for _ in range(3):  # warm-up
            for run in runners.values():
                run(x)
        for _ in range(rounds):
            for name, run in runners.items():
                start = clock()
                run(x)
                times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--runs", type=int, default=1, help="sittings, one after the other")
    parser.add_argument("--compare", default=None, help="another checkout whose MultiHeadAttention is timed beside")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--cpu", action="store_true", help="thread CPU time instead of wall-clock (with --threads 1)")
    args = parser.parse_args()
    if args.cpu and args.threads != 1:
        parser.error("--cpu counts this thread only: use it with --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu else time.perf_counter
    other = load_other(args.compare) if args.compare else None
    ratios: dict[tuple, list] = {}
    for sitting in range(args.runs):
        # The load average says how much else the machine was doing: the ratios are only as good as that.
        print(
            f"run {sitting + 1}: {machine()}; batch 1, medians of {args.rounds} interleaved rounds (n = 1024: a quarter), "
            f"{'thread CPU' if args.cpu else 'wall-clock'} time\n"
        )
        extra = " | before (ms) | core / before" if other else ""
        print(f"| d_model | n | core (ms) | torch+w (ms) | torch (ms) | core / torch+w | core / torch{extra} |")
        print("|---:|---:|---:|---:|---:|---:|---:" + ("|---:|---:|" if other else "|"))
        for d_model, heads in CONFIGS:
            for n in args.lengths:
                rounds = args.rounds if n < 1024 else max(5, args.rounds // 4)
                med = measure(d_model, heads, n, rounds, other, clock)
                row = (med["core"] / med["torch+w"], med["core"] / med["torch"])
                cells = f"{med['core'] * 1e3:.2f} | {med['torch+w'] * 1e3:.2f} | {med['torch'] * 1e3:.2f}"
                line = f"| {d_model} | {n} | {cells} | {row[0]:.3f} | {row[1]:.3f}"
                if other:
                    row += (med["core"] / med["before"],)
                    line += f" | {med['before'] * 1e3:.2f} | {row[2]:.3f}"
                print(line + " |", flush=True)
                ratios.setdefault((d_model, n), []).append(row)
        print()
    if args.runs > 1:
        names = ["core / torch+w", "core / torch"] + (["core / before"] if other else [])
        print("| d_model | n | " + " | ".join(f"{name} (min-max)" for name in names) + " |")
        print("|---:|---:|" + "---:|" * len(names))
        for (d_model, n), rows in ratios.items():
            spans = [f"{min(r[i] for r in rows):.3f}-{max(r[i] for r in rows):.3f}" for i in range(len(names))]
            print(f"| {d_model} | {n} | " + " | ".join(spans) + " |")
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"\nload average after: {load}")


if __name__ == "__main__":
    main()
