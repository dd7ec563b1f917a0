"""Benchmark: token attribution on SmolLM2 (mha_core.token_attribution, issue 33).

Every measurement is timed against one plain forward pass of the same ~20-token prompt in the same run, the
variants interleaved round by round (the machine is shared: ratios travel, absolute seconds do not):

  forward        one LM forward pass of the prompt (the unit)
  ig             integrated gradients, 32 steps (batches of 8 points, forward and backward)   goal <= 40 passes
  occlusion      leave each ordinary token out (n - 1 sequences, one batched pass) + the whole  goal <= n + 1
  gxi            gradient x input (one forward and backward pass)
  vz             value zeroing (every layer's zeroing of each token, n rows in batches of 16, + the unedited pass)
  curves         (--curves) deletion and insertion curves of the seven methods and three random orders
  text           (--study) one text of the findings' study (attribution_study: every method, the references'
                 agreement, the curves of seven methods and three random orders, the heads' agreement)

With --before, ig, curves and text are timed twice, interleaved: as the library does it now (a decoder's curves
and occlusion in a few padded passes of mixed lengths, integrated gradients' points in as few passes as
STEP_TOKENS allows) and as it did before (one pass per length, 8 points a pass), the "(before)" rows.

Prints a markdown table (median seconds, ratio to one forward pass, the goal, the model passes each one made and
their rows x tokens summed, counted in the warm-up) and the 1-minute load average before and after.
Usage: python -m bench.attribution [--threads T] [--rounds R] [--curves] [--study] [--before] [--only forward vz ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

import mha_core as mc
from mha_core.interventions import token_attribution as attribution_module
from mha_core.interventions.attribution_study import attribution_study
from mha_core.interventions.faithfulness import faithfulness
from mha_core.interventions.token_attribution import DEFAULT_STEPS, step_batch

PROMPT = "It was a sunny day in the town. When Mary and John went to the store, John gave a drink to"


def by_length(lengths, *_, **__) -> list[list[int]]:
    """The earlier plan: one pass per length."""
    groups: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        groups.setdefault(length, []).append(index)
    return list(groups.values())


@contextlib.contextmanager
def earlier(tokens: int):
    """The library as it was: one pass per length, integrated gradients' points 8 a pass."""
    kept = attribution_module.padded_batches, attribution_module.STEP_TOKENS
    attribution_module.padded_batches, attribution_module.STEP_TOKENS = by_length, 8 * tokens
    try:
        yield
    finally:
        attribution_module.padded_batches, attribution_module.STEP_TOKENS = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--curves", action="store_true", help="also time the deletion and insertion curves")
    parser.add_argument("--study", action="store_true", help="also time one text of the findings' study")
    parser.add_argument("--before", action="store_true", help="also time ig, curves and text as the library was")
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
    if args.study:
        variants["text"] = lambda: attribution_study(model, [(PROMPT, None)])
    if args.before:
        for name in [name for name in ("ig", "curves", "text") if name in variants]:
            variants[f"{name} (before)"] = earlier_variant(variants[name], tokens)
    passes: dict[str, list[tuple[int, int]]] = {name: [] for name in variants}
    run_pass, shapes = model.run_pass, []

    def counted(forward, *rest, **named):  # every model pass, with its batch shape and whether it has a backward
        shapes.append(tuple(forward.input_ids.shape))
        return run_pass(forward, *rest, **named)

    model.run_pass = counted
    for name, function in variants.items():  # warm-up, counting the passes
        shapes.clear()
        function()
        passes[name] = list(shapes)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, function in variants.items():  # interleaved: every round times each variant once
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    unit = median["forward"]
    goals = {"ig": "<= 40", "occlusion": f"<= n + 1 = {ordinary + 1}"}
    print(f"SmolLM2, a {tokens}-token prompt ({ordinary} ordinary tokens), {torch.get_num_threads()} threads, "
          f"{args.rounds} interleaved rounds; integrated gradients {step_batch(tokens)} points a pass")  # fmt: skip
    print("| variant | median s | forward passes | goal | model passes | rows x tokens |")
    print("|---|---|---|---|---|---|")
    for name in variants:
        made = len(passes[name]) or 1  # the plain forward pass calls transformers directly
        rows = sum(batch * length for batch, length in passes[name]) or tokens
        print(f"| {name} | {median[name]:.3f} | {median[name] / unit:.2f} | {goals.get(name, '')} | {made} | "
              f"{rows} |")  # fmt: skip
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


def earlier_variant(function, tokens: int):
    def timed():
        with earlier(tokens):
            function()

    return timed


if __name__ == "__main__":
    main()
