"""Benchmark: MiniLM's head cards over UD EWT dev sentences (mha_core.head_cards; goal: 2,000 sentences <= 10 min).

The cards are a corpus profile (roles), one more padded pass over the corpus that reads every head's output at
``attn.hook_z`` (the contexts), and the copying scores. Each round times a corpus profile alone, then the cards
from nothing cached, then the cards when the profile is cached (as after the Roles page's profile: the contexts'
pass and the copying scores), interleaved, so the ratios to the profile are measured under the same load; the seconds are
extrapolated linearly to 2,000 sentences when fewer are run (the passes are batched by length, so the time grows
with the sentences' tokens, about linearly over the dev split's first thousands).

``--browser K`` then times a card opening in the browser (goal: <= 1 s): the Heads page served as scripts/app.sh
serves it, in Debian Chromium, with the cards of these sentences cached; K clicks on rows of the heads table (one head
after another), each from the click until the page shows that head's card and nothing on it is stale.

Usage: python -m bench.head_cards [--sentences N] [--rounds R] [--threads T] [--browser K]
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
CARD_GOAL_S = 1.0
ROW_PX = 35  # the heads table's header and row height (Streamlit's default): row r lists head r in order
IDLE_JS = """() => !document.querySelector('[data-stale="true"]')"""


def card_opens(sentences: int, clicks: int) -> list[float]:
    """Seconds from a click on row r of the heads table (head r, in order) until that head's card is on the screen,
    for rows 1..clicks, with the cards of ``sentences`` cached (this process's ``HEADSCOPE_CACHE_DIR``)."""
    import time

    from tools.browser import chromium_page, streamlit_server, wait_for_app

    times = []
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/heads?hsent={sentences}")
        wait_for_app(page)
        page.get_by_text("Head 0-0", exact=True).wait_for(timeout=600_000)  # built or read from the cache
        heads = mc.load_model("minilm").num_heads
        for row in range(1, clicks + 1):
            table = page.locator('[data-testid="stDataFrame"]').first
            table.scroll_into_view_if_needed()
            box = table.bounding_box()
            start = time.perf_counter()
            page.mouse.click(box["x"] + 12, box["y"] + ROW_PX * (row + 1) + ROW_PX / 2)
            page.get_by_text(f"Head {row // heads}-{row % heads}", exact=True).wait_for(timeout=120_000)
            page.wait_for_function(IDLE_JS, timeout=120_000)
            times.append(time.perf_counter() - start)
            page.goto(f"{url}/heads?hsent={sentences}")  # the table back at its top
            wait_for_app(page)
    return times


def main() -> None:
    parser = timing.parser(__doc__)
    parser.add_argument("--sentences", type=int, default=GOAL_SENTENCES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--browser", type=int, default=0, metavar="K", help="then time K card openings in Chromium")
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
    if args.browser:
        mc.head_cards(model, sentences)  # into this run's cache, which the server reads
        before = os.getloadavg()[0]
        opens = card_opens(len(sentences), args.browser)
        verdict = "met" if statistics.median(opens) <= CARD_GOAL_S else "not met"
        print(
            "\n| card opened in Chromium (click -> card shown) | clicks | median (s) | max (s) | goal | load average |"
        )
        print("|---|---:|---:|---:|---|---:|")
        print(
            f"| MiniLM, {len(sentences)} sentences' cards cached | {len(opens)} | {statistics.median(opens):.2f} | "
            f"{max(opens):.2f} | <= {CARD_GOAL_S:.0f} s: {verdict} (median) | {before:.1f}-{os.getloadavg()[0]:.1f} |"
        )


if __name__ == "__main__":
    main()
