"""Benchmark: one score decomposition (mha_core.score_decomposition) against one plain forward pass.

For MiniLM and SmolLM2, on a sentence of about 30 tokens, the deepest layer's decomposition (the most sources: every
earlier head and MLP) of the last query and its second key, timed against one forward pass of the base model on the
same tokens (eager attention, what a run costs), the two interleaved round by round in one run (the machine is
shared: ratios travel, absolute seconds do not). Goal: a decomposition <= 2 forward passes.

Prints a markdown table (median seconds of each, the median of the per-round ratios, the goal) and the 1-minute
load average before and after.
Usage: python -m bench.decomposition [--rounds R] [--threads T] [--models minilm smollm2]
"""

from __future__ import annotations

import os
import statistics

import torch

import mha_core as mc
from bench import timing

TEXT = (
    "The old lighthouse keeper climbed the stairs every evening, lit the lamp, and watched the ships "
    "pass safely through the narrow channel."
)
GOAL = 2.0


def measure(name: str, rounds: int) -> tuple:
    model = mc.load_model(name)
    encoded = model.encode(TEXT)
    ids = torch.tensor([encoded.input_ids])
    layer, query = model.num_layers - 1, len(encoded) - 1

    def forward():
        with torch.inference_mode():
            model.hf_model(input_ids=ids)

    def decomposition():
        mc.score_decomposition(model, encoded, layer, 0, query, 1)

    forward(), decomposition()  # warm-up
    forward_s, decomposition_s, ratios = [], [], []
    for _ in range(rounds):  # interleaved: each round times both
        f, d = timing.seconds(forward), timing.seconds(decomposition)
        forward_s.append(f)
        decomposition_s.append(d)
        ratios.append(d / f)
    return name, len(encoded), statistics.median(forward_s), statistics.median(decomposition_s), ratios


def main() -> None:
    parser = timing.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    args = timing.parsed(parser)
    load_before = os.getloadavg()[0]
    results = [measure(name, args.rounds) for name in args.models]
    load_after = os.getloadavg()[0]
    print(f"threads {torch.get_num_threads()}, {args.rounds} interleaved rounds")
    print("| model | tokens | forward pass (s) | decomposition, last layer (s) | ratio (median) | goal |")
    print("|---|---|---|---|---|---|")
    for name, tokens, forward_s, decomposition_s, ratios in results:
        ratio = statistics.median(ratios)
        print(
            f"| {name} | {tokens} | {forward_s:.3f} | {decomposition_s:.3f} | {ratio:.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}) | <= {GOAL:g} {'met' if ratio <= GOAL else 'NOT met'} |"
        )
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")


if __name__ == "__main__":
    main()
