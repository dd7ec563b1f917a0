"""Benchmark: what heads' weights do and how they compose, on SmolLM2 (mha_core.interventions.qkov, path_patching).

Each measurement is timed against one plain forward pass of the induction prompt (14 tokens) in the same run,
interleaved (forward, measurement, forward, ...; the unit is the median of the forward passes around them): the
machine is shared, ratios travel, absolute seconds do not.

  composition    Q-, K- and V-composition of all 270 x 270 head pairs (goal <= 60 s)
  copying        every head's copying and previous-token score
  OV circuit     one head's top 10 output tokens at 16 tokens (and QK: top 10 keys)
  path patching  one batch of 16 senders into the 4 induction heads through their keys (two passes of 16 rows);
                 a sweep of every sender before layer 18 is 162 / 16 such batches, printed as the estimate

Usage: python -m bench.circuits_qkov [--threads T] [--batch-size B]
"""

from __future__ import annotations

import math
import os
import statistics

import torch

import mha_core as mc
from bench import timing
from mha_core.interventions import qkov
from mha_core.interventions.path_patching import PathPatchRun
from mha_core.interventions.prompts import TASKS_BY_NAME

INDUCTION_HEADS = ((17, 3), (17, 4), (18, 6), (18, 7))


def main() -> None:
    parser = timing.parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = timing.parsed(parser)
    model = mc.load_model("smollm2")
    task = TASKS_BY_NAME["induction"]
    ids = torch.tensor([model.encode(task.clean).input_ids])

    def forward():
        with torch.inference_mode():
            model.lm_model(input_ids=ids)

    qkov.head_weights(model)  # read once per model, as the app does
    forward()
    run = PathPatchRun(model, task.clean, task.corrupted, task.answer, task.foil)
    senders = [(layer, head) for layer in range(8, 18) for head in range(9)][: args.batch_size]
    measurements = (
        ("composition, 270 x 270 pairs (Q, K, V)", lambda: mc.composition(model), 60.0),
        ("copying and previous-token scores", lambda: mc.copying_scores(model), None),
        (
            "OV and QK circuits of one head, 16 tokens",
            lambda: (mc.ov_circuit(model, 18, 6), mc.qk_circuit(model, 18, 6)),
            None,
        ),
        (
            f"path patching, {len(senders)} senders -> 4 receivers (K)",
            lambda: run.patched(senders, list(INDUCTION_HEADS), "k"),
            None,
        ),
    )
    rows = []
    for name, function, goal in measurements:
        before = timing.seconds(forward)
        load = os.getloadavg()[0]
        elapsed = timing.seconds(function)
        unit = statistics.median([before, timing.seconds(forward), timing.seconds(forward)])
        rows.append((name, elapsed, elapsed / unit, goal, load))
    print(f"SmolLM2, induction prompt ({ids.shape[1]} tokens), torch threads {torch.get_num_threads()}")
    print("| measurement | seconds | forward passes | goal | load average (1 min) |")
    print("|---|---:|---:|---|---:|")
    for name, elapsed, ratio, goal, load in rows:
        verdict = f"<= {goal:g} s: {'met' if elapsed <= goal else 'missed'}" if goal else ""
        print(f"| {name} | {elapsed:.2f} | {ratio:.1f} | {verdict} | {load:.1f} |")
    batch = rows[-1][1]
    sweeps = math.ceil(18 * 9 / len(senders))
    print(f"a sweep of all 162 senders before layer 18: about {sweeps} batches, {sweeps * batch:.0f} s")


if __name__ == "__main__":
    main()
