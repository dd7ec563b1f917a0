"""Benchmark: circuits on SmolLM2 (mha_core.interventions: logit attribution, patching, the logit lens).

Every measurement is timed against one plain forward pass of the same prompt in the same run (the machine is
shared: ratios travel, absolute seconds do not). The prompt pair is padded to about 20 tokens (the indirect
object task of mha_core.interventions.prompts with a longer opening, the same in both prompts):

  forward        one LM forward pass of the clean prompt (the unit)
  attribution    mc.logit_attribution of the clean prompt            goal <= 1.2 forward passes
  attribution patching over all 270 heads (no exact heads beside it)  goal <= 3 forward passes
  exact patching over all 270 heads, batched                         goal <= 30 s
  logit lens     every layer's top 5 at every position

Prints a markdown table (seconds, ratio to one forward pass, goal, and the same in process CPU seconds, which a
crowded machine inflates less than wall-clock time) and the 1-minute load average before and after. With --findings, instead: for every shipped task, SmolLM2's logit differences and the heads that carry it
(attribution patching over every head with the 20 heads of largest estimate patched exactly: the top 5 by exact
score; and the top 5 by direct logit attribution), the table of docs/findings.md.
Usage: python -m bench.circuits [--threads T] [--rounds R] [--batch-size B] [--findings]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import mha_core as mc
from mha_core.interventions.prompts import CIRCUIT_TASKS, TASKS_BY_NAME

OPENING = "It was a sunny day in the town. "


def timed(function, rounds: int) -> tuple[float, float]:
    """Median wall-clock and process CPU seconds of ``rounds`` calls (after one warm-up call)."""
    function()
    times, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        function()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--findings", action="store_true", help="the heads that carry each shipped task")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.findings:
        findings(mc.load_model("smollm2"), args.batch_size)
        return
    load_before = os.getloadavg()[0]
    model = mc.load_model("smollm2")
    task = TASKS_BY_NAME["ioi"]
    clean, corrupted = OPENING + task.clean, OPENING + task.corrupted
    ids = torch.tensor([model.encode(clean).input_ids])
    tokens = ids.shape[1]

    def forward():
        with torch.inference_mode():
            model.lm_model(input_ids=ids)

    pair = (model, clean, corrupted, task.answer, task.foil)
    forward_s, forward_cpu = timed(forward, args.rounds)
    rows = [
        ("one forward pass", (forward_s, forward_cpu), None),
        (
            "logit attribution",
            timed(lambda: mc.logit_attribution(model, clean, task.answer, task.foil), args.rounds),
            1.2,
        ),
        (
            "attribution patching, 270 heads",
            timed(lambda: mc.patch(*pair, method="attribution", exact_top=0), args.rounds),
            3.0,
        ),
        ("exact patching, 270 heads", timed(lambda: mc.patch(*pair, batch_size=args.batch_size), 1), None),
        ("logit lens, top 5", timed(lambda: mc.logit_lens(model, clean, k=5), args.rounds), None),
    ]
    print(f"SmolLM2, {tokens}-token prompt pair, torch threads {torch.get_num_threads()}, batch {args.batch_size}")
    print("| measurement | seconds | forward passes | goal | CPU s | CPU forward passes |")
    print("|---|---:|---:|---|---:|---:|")
    for name, (seconds, cpu), goal in rows:
        ratio = seconds / forward_s
        if goal is not None:
            verdict = f"<= {goal} passes: {'met' if ratio <= goal else 'missed'}"
        elif name.startswith("exact"):
            verdict = f"<= 30 s: {'met' if seconds <= 30 else 'missed'}"
        else:
            verdict = ""
        print(f"| {name} | {seconds:.3f} | {ratio:.2f} | {verdict} | {cpu:.3f} | {cpu / forward_cpu:.2f} |")
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


def findings(model, batch_size: int, exact_top: int = 20) -> None:
    """Per shipped task: the logit differences; the top heads by patching (attribution patching over all 270
    heads, then the ``exact_top`` heads of largest estimate patched exactly: the top 5 of those by exact score,
    with their estimate); the top heads by direct logit attribution."""
    print("| task | clean | corrupted | top heads by patching: exact (estimate) | top heads by attribution (logit) |")
    print("|---|---:|---:|---|---|")
    for task in CIRCUIT_TASKS:
        patched = mc.patch(
            model,
            task.clean,
            task.corrupted,
            task.answer,
            task.foil,
            method="attribution",
            exact_top=exact_top,
            batch_size=batch_size,
        )
        attribution = mc.logit_attribution(model, task.clean, task.answer, task.foil)
        heads = attribution[attribution["component"] == "head"]
        by_patch = patched[patched["exact"].notna()].sort_values("exact", ascending=False).head(5)
        by_logit = heads.sort_values("contribution", ascending=False).head(5)
        print(
            f"| {task.name} | {patched.attrs['clean_metric']:.2f} | {patched.attrs['corrupted_metric']:.2f} | "
            + ", ".join(f"{r.layer}-{r.head} {r.exact:.2f} ({r.score:.2f})" for r in by_patch.itertuples())
            + " | "
            + ", ".join(f"{r.layer}-{r.head} {r.contribution:+.2f}" for r in by_logit.itertuples())
            + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
