"""Benchmark: MPNet (12 x 12) in Headscope, and what the Deeper views cost, on CPU.

One text of 128 tokens; contestants timed in one run, interleaved round by round so that machine
load hits them alike:

  bare forward    transformers' MPNetModel forward with eager attention, output_attentions=False
  run             model.run(text): the forward pass with every layer's attentions captured
  run + norms     model.run(text, norms=True): the same pass, plus norm-based attention for 144 heads
  rollout         mha_core.attention_rollout(run)

Prints medians of wall-clock and of CPU time (``time.process_time``: on a machine shared with other
work, CPU time is what the process itself spent, while wall time also counts the waits for a core),
and the ratios run / bare forward (goal <= 1.10) and (norms extra + rollout) / bare forward
(goal <= 0.25) on both. Usage: python -m bench.deeper [--rounds N] [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import mha_core as mc

TOKENS = 128


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = mc.load_model("mpnet")
    words = ("the keys to the old wooden cabinet are on the kitchen table near the window " * 20).split()
    ids = model.encode(words).input_ids[:TOKENS]
    text = model.tokenizer.decode(ids[1:-1])
    run = model.run(text)
    n = run.num_tokens
    inputs = {"input_ids": torch.tensor([run.metadata["token_ids"]])}

    def bare():
        with torch.inference_mode():
            model.hf_model(**inputs)

    contestants = {
        "bare forward": bare,
        "run": lambda: model.run(text),
        "run + norms": lambda: model.run(text, norms=True),
        "rollout": lambda: mc.attention_rollout(run),
    }
    for fn in contestants.values():
        fn()  # warm-up
    wall = {name: [] for name in contestants}
    cpu = {name: [] for name in contestants}
    for _ in range(args.rounds):
        for name, fn in contestants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print(f"MPNet, {n} tokens, torch threads {torch.get_num_threads()}, {args.rounds} rounds (medians)\n")
    print("| contestant | wall ms | CPU ms |\n|---|---|---|")
    medians = {}
    for label, times in (("wall", wall), ("CPU", cpu)):
        medians[label] = {name: statistics.median(values) for name, values in times.items()}
    for name in contestants:
        print(f"| {name} | {1000 * medians['wall'][name]:.1f} | {1000 * medians['CPU'][name]:.1f} |")
    print()
    for label, median in medians.items():
        extra = median["run + norms"] - median["run"] + median["rollout"]
        print(
            f"{label}: run / bare forward {median['run'] / median['bare forward']:.2f} (goal <= 1.10); "
            f"(norms + rollout) / bare forward {extra / median['bare forward']:.2f} (goal <= 0.25)"
        )


if __name__ == "__main__":
    main()
