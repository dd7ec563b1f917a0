"""Benchmark: token attribution on SmolLM2 (mha_core.token_attribution, issue 33).

Every measurement is timed against one plain forward pass of the same ~20-token prompt in the same run, the
variants interleaved round by round (the machine is shared: ratios travel, absolute seconds do not):

  forward        one LM forward pass of the prompt (the unit)
  ig             integrated gradients, 32 steps (batches of 8 points, forward and backward)   goal <= 40 passes
  occlusion      leave each ordinary token out (n - 1 sequences, one batched pass) + the whole  goal <= n + 1
  gxi            gradient x input (one forward and backward pass)
  vz             value zeroing (every layer's zeroing of each token, n rows in batches of 16, + the unedited pass)
  curves         (--curves) deletion and insertion curves of six methods and three random orders

Prints a markdown table (median seconds, ratio to one forward pass, the goal, and the number of model passes each
one makes) and the 1-minute load average before and after.
Usage: python -m bench.attribution [--threads T] [--rounds R] [--curves] [--only forward vz ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import mha_core as mc
from mha_core.interventions.faithfulness import faithfulness
from mha_core.interventions.token_attribution import DEFAULT_STEPS, STEP_BATCH
from mha_core.interventions.value_zeroing import ZERO_BATCH

PROMPT = "It was a sunny day in the town. When Mary and John went to the store, John gave a drink to"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--curves", action="store_true", help="also time the deletion and insertion curves")
    parser.add_argument("--only", nargs="+", default=None, help="time these variants only (forward always)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    model = mc.load_model("smollm2")
    ids = torch.tensor([model.encode(PROMPT).input_ids])
    tokens = ids.shape[1]
    ordinary = int((~model.encode(PROMPT).special_mask).sum())

    def forward():
        with torch.inference_mode():
            model.lm_model(input_ids=ids)

    variants = {
        "forward": forward,
        "ig": lambda: mc.token_attribution(model, PROMPT, methods=("integrated_gradients",), steps=DEFAULT_STEPS),
        "occlusion": lambda: mc.token_attribution(model, PROMPT, methods=("occlusion",)),
        "gxi": lambda: mc.token_attribution(model, PROMPT, methods=("gradient_x_input",)),
        "vz": lambda: mc.token_attribution(model, PROMPT, methods=("value_zeroing",)),
    }
    if args.only:
        variants = {name: function for name, function in variants.items() if name == "forward" or name in args.only}
    if args.curves:
        attribution = mc.token_attribution(model, PROMPT)  # every method: the curves' orders
        variants["curves"] = lambda: faithfulness(model, PROMPT, attribution, seeds=3)
    for function in variants.values():  # warm-up
        function()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, function in variants.items():  # interleaved: every round times each variant once
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    unit = median["forward"]
    # Passes each makes beyond the target's choice and f on the whole (one pass each, counted here too).
    passes = {
        "forward": "1",
        "ig": f"{DEFAULT_STEPS // STEP_BATCH} batched fwd+bwd of {STEP_BATCH} + 3",
        "occlusion": f"1 batched of {ordinary} + 2",
        "gxi": "1 fwd+bwd + 2",
        "vz": f"1 + {-(-tokens // ZERO_BATCH)} batched of <= {ZERO_BATCH} ({tokens} rows) + 2",
        "curves": "one batched pass per length",
    }
    goals = {"ig": "<= 40", "occlusion": f"<= n + 1 = {ordinary + 1}"}
    print(f"SmolLM2, a {tokens}-token prompt ({ordinary} ordinary tokens), {torch.get_num_threads()} threads, "
          f"{args.rounds} interleaved rounds")  # fmt: skip
    print("| variant | median s | forward passes | goal | passes made |")
    print("|---|---|---|---|---|")
    for name in variants:
        print(f"| {name} | {median[name]:.3f} | {median[name] / unit:.1f} | {goals.get(name, '')} | {passes[name]} |")
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
