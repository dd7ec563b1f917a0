"""Benchmark: writing with every head's attention kept (``mha_core.generate``) against transformers' own ``generate``
with the key/value cache, both greedy, the same prompt and the same number of new tokens, on SmolLM2.

The two are interleaved round by round (the machine is shared: ratios measured in one run travel, absolute
seconds do not). Per new token: the whole call's seconds over the tokens written (the prompt's pass included
in both). ``mha_core.generate`` also runs the pass of the last written token (its attention row), which
``transformers.generate`` never needs: one pass more than transformers for the same tokens. Goal: <= 1.3 x.

Prints a markdown table: median seconds per new token of each, and the ratio (the median of each round's
ratio). Usage: python -m bench.generate [--tokens N] [--rounds R] [--threads T]
"""

from __future__ import annotations

import os
import statistics

import torch

import mha_core as mc
from bench import timing

PROMPT = "The history of the city begins with a small village by the river, where"
GOAL = 1.3


def transformers_generate(model, ids: list[int], tokens: int) -> list[int]:
    with torch.inference_mode():
        out = model.lm_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=model.pad_token_id,
        )
    return out[0, len(ids) :].tolist()


def headscope_generate(model, tokens: int) -> list[int]:
    run = mc.generate(model, PROMPT, tokens, temperature=0.0, stop=())
    return run.metadata["token_ids"][run.metadata["generation"]["prompt_tokens"] :]


def main() -> None:
    parser = timing.parser(__doc__, threads=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="smollm2")
    args = timing.parsed(parser)
    model = mc.load_model(args.model)
    ids = model.encode(PROMPT).input_ids
    assert headscope_generate(model, args.tokens) == transformers_generate(model, ids, args.tokens)  # same tokens
    ours, theirs, ratios = [], [], []
    for _ in range(args.rounds):
        a = timing.seconds(lambda: headscope_generate(model, args.tokens)) / args.tokens
        b = timing.seconds(lambda: transformers_generate(model, ids, args.tokens)) / args.tokens
        ours.append(a)
        theirs.append(b)
        ratios.append(a / b)
    load = os.getloadavg()
    print(
        f"{args.model}, prompt {len(ids)} tokens, {args.tokens} new tokens, {args.rounds} interleaved rounds, "
        f"{args.threads} thread(s); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| variant | s per new token (median) |")
    print("|---|---|")
    print(f"| transformers generate (cache, no attentions) | {statistics.median(theirs):.4f} |")
    print(f"| mha_core.generate (cache, every head's attention kept) | {statistics.median(ours):.4f} |")
    ratio = statistics.median(ratios)
    print(
        f"\nratio (median of rounds): {ratio:.2f} x (goal <= {GOAL} x: {'met' if ratio <= GOAL else 'NOT met'}); "
        f"rounds: {', '.join(f'{r:.2f}' for r in ratios)}"
    )


if __name__ == "__main__":
    main()
