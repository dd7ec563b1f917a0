"""Benchmark: the from-scratch core against torch.nn.MultiheadAttention on CPU.

d_model = 768, 12 heads, batch 1, n in {64, 256, 1024}. Three contestants, timed in one run,
interleaved round by round so that machine load hits them alike, all under torch.inference_mode:

  core          mha_core.MultiHeadAttention, returns output and per-head weights
  torch+w       nn.MultiheadAttention(need_weights=True, average_attn_weights=False)
  torch         nn.MultiheadAttention(need_weights=False) (fused scaled_dot_product_attention)

Prints a markdown table of medians and the ratios core / torch+w (goal <= 1.0) and
core / torch (goal <= 1.10), of wall-clock time and of this process's CPU time (on a loaded machine the
wall clock counts the time other processes held the core; with --threads 1 the CPU time is the work done).
Usage: python -m bench.core [--rounds N] [--threads T] [--lengths 256 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

import mha_core as mc

D_MODEL, NUM_HEADS = 768, 12
LENGTHS = (64, 256, 1024)


def contestants(reference: nn.MultiheadAttention):
    core = mc.MultiHeadAttention.from_torch(reference).eval()
    return {
        "core": lambda x: core(x),
        "torch+w": lambda x: reference(x, x, x, need_weights=True, average_attn_weights=False),
        "torch": lambda x: reference(x, x, x, need_weights=False),
    }


def measure(n: int, rounds: int) -> dict[str, dict[str, float]]:
    """``{clock: {contestant: median seconds}}`` for the wall clock ("wall") and this process's CPU time ("cpu")."""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(D_MODEL, NUM_HEADS, batch_first=True).eval()
    runners = contestants(reference)
    x = torch.randn(1, n, D_MODEL)
    times = {clock: {name: [] for name in runners} for clock in ("wall", "cpu")}
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
                start, cpu = time.perf_counter(), time.process_time()
                run(x)
                times["wall"][name].append(time.perf_counter() - start)
                times["cpu"][name].append(time.process_time() - cpu)
    return {clock: {name: statistics.median(values) for name, values in by.items()} for clock, by in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # The load average says how much else the machine was doing: the ratios are only as good as that.
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average {load}; "
        f"d_model={D_MODEL}, heads={NUM_HEADS}, batch 1, medians of {args.rounds} interleaved rounds\n"
    )
    print(
        "| n | core (ms) | torch+w (ms) | torch (ms) | core / torch+w | core / torch | CPU ms: core / torch+w / torch "
        "| CPU: core / torch+w | CPU: core / torch |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.lengths:
        med = measure(n, args.rounds)
        wall, cpu = med["wall"], med["cpu"]
        print(
            f"| {n} | {wall['core'] * 1e3:.2f} | {wall['torch+w'] * 1e3:.2f} | {wall['torch'] * 1e3:.2f} | "
            f"{wall['core'] / wall['torch+w']:.2f} | {wall['core'] / wall['torch']:.2f} | "
            f"{cpu['core'] * 1e3:.2f} / {cpu['torch+w'] * 1e3:.2f} / {cpu['torch'] * 1e3:.2f} | "
            f"{cpu['core'] / cpu['torch+w']:.2f} | {cpu['core'] / cpu['torch']:.2f} |",
            flush=True,
        )
    print(f"\nload average at the end {', '.join(f'{value:.1f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
