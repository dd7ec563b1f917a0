"""Benchmark: MiniLM's head cards over UD EWT dev sentences (mha_core.head_cards; goal: 2,000 sentences <= 10 min).

The cards are a corpus profile (roles), one more padded pass over the corpus that reads every head's output at
``attn.hook_z`` (the contexts), and the copying scores. Each round times a corpus profile alone, then the cards
from nothing cached, then the cards when the profile is cached (as after the Roles page's profile: the contexts'
pass and the copying scores), interleaved, so the ratios to the profile are measured under the same load; the seconds are
extrapolated linearly to 2,000 sentences when fewer are run (the passes are batched by length, so the time grows
with the sentences' tokens, about linearly over the dev split's first thousands).

Usage: python -m bench.head_cards [--sentences N] [--rounds R] [--threads T]
"""

from __future__ import annotations

import os
import statistics
import tempfile

import torch

import mha_core as mc
from bench import timing
from mha_core.corpus import profiling
from mha_core.corpus.cards import build_cards

GOAL_SENTENCES, GOAL_S = 2000, 600.0


def main() -> None:
    parser = timing.parser(__doc__)
    parser.add_argument("--sentences", type=int, default=GOAL_SENTENCES)
    parser.add_argument("--rounds", type=int, default=1)
    args = timing.parsed(parser)
    model = mc.load_model("minilm")
    sentences = mc.ud_ewt_dev(args.sentences)
    os.environ["HEADSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-cards-")  # a cache of its own
    profiles, cards, warm, loads = [], [], [], []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        profiles.append(timing.seconds(lambda: mc.profile(model, sentences, cache=False)))
        loads.append(os.getloadavg()[0])
        cards.append(timing.seconds(lambda: mc.head_cards(model, sentences, cache=False)))
        mc.profile(model, sentences)  # into the cache
        loads.append(os.getloadavg()[0])
        warm.append(timing.seconds(lambda: build_cards(model, sentences, cache=True)))
        profiling.clear_memory_cache()
    loads.append(os.getloadavg()[0])
    profile_s, cards_s, warm_s = (statistics.median(times) for times in (profiles, cards, warm))
    scale = GOAL_SENTENCES / len(sentences)
    print(
        f"MiniLM, {len(sentences)} UD EWT dev sentences, torch threads {torch.get_num_threads()}, {args.rounds} round(s)"
    )
    print("| measurement | seconds | x profile | at 2,000 sentences | goal | load average (1 min) |")
    print("|---|---:|---:|---:|---|---:|")
    load = f"{min(loads):.1f}-{max(loads):.1f}"
    print(f"| corpus profile | {profile_s:.1f} | 1.00 | {profile_s * scale:.0f} s |  | {load} |")
    for name, value in (("head cards (profile, contexts, copying)", cards_s), ("head cards, profile cached", warm_s)):
        verdict = "met" if value * scale <= GOAL_S else "not met"
        print(
            f"| {name} | {value:.1f} | {value / profile_s:.2f} | {value * scale:.0f} s | "
            f"<= {GOAL_S:.0f} s: {verdict} | {load} |"
        )


if __name__ == "__main__":
    main()
