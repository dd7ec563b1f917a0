"""Browser timings: pressing Enter in the sentence box until the view is drawn, in Debian Chromium.

    python -m bench.browser [--repeats 5]

One ``streamlit run app.py`` server, one browser, warm (each model loaded and one sentence run
before timing). Each timed repeat types a new sentence (a different marker word, so no cached run
is reused) and waits until the figure holding that word is drawn: for the head view, all heads of
layer 0 labelled and painted (``tools.browser.head_view_js``); for the model view, every layer and head. Also
counts the bytes the server sent over the websocket for that rerun (the whole page update).
Prints one table of medians; goals: head view <= 1.0 s and model view <= 2.0 s at 128 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]

from tools.browser import (  # noqa: E402
    chromium_page,
    head_view_js,
    model_view_js,
    streamlit_server,
    type_sentence,
    wait_for_app,
)

MARKERS = ["dog", "bird", "fish", "horse", "cow", "pig", "lion", "bear", "wolf", "fox", "goat", "duck"]
FILLER = [
    "the",
    "man",
    "and",
    "the",
    "woman",
    "went",
    "to",
    "the",
    "market",
    "in",
    "the",
    "town",
    "on",
    "a",
    "cold",
    "day",
    "and",
    "they",
    "saw",
    "a",
    "red",
    "car",
    "near",
    "the",
    "old",
    "house",
    "by",
    "the",
    "river",
    "where",
    "the",
    "children",
    "play",
    "every",
    "summer",
]
CASES = [("minilm", 20), ("minilm", 128), ("smollm2", 20)]
GOALS = {("head view", 128): 1.0, ("model view", 128): 2.0}


def sentence(model, marker: str, num_tokens: int) -> tuple[str, int]:
    """A sentence with ``marker`` second that the model reads as exactly (or just under) ``num_tokens`` tokens.

    Second, after "the": a byte-level BPE splits some words at the very start ("cow" -> "c", "ow"),
    while " cow" is one token, and the wait looks for the marker as a whole token.
    """
    words = ["the", marker]
    while True:
        candidate = words + [FILLER[(len(words) - 2) % len(FILLER)]]
        if len(model.tokenizer(" ".join(candidate))["input_ids"]) > num_tokens:
            break
        words = candidate
    text = " ".join(words)
    return text, len(model.tokenizer(text)["input_ids"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cases", default=",".join(f"{m}:{n}" for m, n in CASES), help="model:tokens pairs, comma-separated"
    )
    parser.add_argument("--views", default="head view,model view")
    args = parser.parse_args()
    cases = [(item.split(":")[0], int(item.split(":")[1])) for item in args.cases.split(",")]
    from mha_core.models import load_model

    models = {name: load_model(name) for name in {name for name, _ in cases}}
    rows = []
    received: list[int] = []
    with streamlit_server() as url, chromium_page(width=1500, height=1100) as page:
        page.on(
            "websocket",
            lambda ws: ws.on(
                "framereceived", lambda frame: received.append(len(frame) if isinstance(frame, (bytes, str)) else 0)
            ),
        )
        for model_name, num_tokens in cases:
            model = models[model_name]
            for view in args.views.split(","):
                warm_text, _ = sentence(model, "cat", num_tokens)
                page.goto(f"{url}/?{urlencode({'model': model_name, 'text': warm_text, 'page': 'explore'})}")
                wait_for_app(page, timeout_ms=600_000)
                page.wait_for_function(head_view_js(model.num_heads, "cat"), timeout=600_000)
                if view == "model view":
                    page.get_by_text("Model view", exact=True).click()
                    page.wait_for_function(model_view_js(model.num_layers, model.num_heads, "cat"), timeout=600_000)
                times, sizes, tokens = [], [], 0
                for marker in MARKERS[: args.repeats]:
                    text, tokens = sentence(model, marker, num_tokens)
                    predicate = (
                        head_view_js(model.num_heads, marker)
                        if view == "head view"
                        else model_view_js(model.num_layers, model.num_heads, marker)
                    )
                    page.wait_for_timeout(300)  # idle before timing; not counted
                    received.clear()
                    start = type_sentence(page, text)
                    try:
                        page.wait_for_function(predicate, timeout=30_000, polling=10)
                    except Exception:
                        # A keypress lost while the page was busy: say so, and do not count this repeat.
                        print(f"  {model_name} {view} {marker}: not drawn within 30 s; repeat dropped", flush=True)
                        page.screenshot(path=str(ROOT / "test-artifacts" / "bench-timeout.png"))
                        type_sentence(page, text)
                        page.wait_for_function(predicate, timeout=120_000, polling=10)
                        wait_for_app(page)
                        continue
                    times.append(time.perf_counter() - start)
                    wait_for_app(page)
                    sizes.append(sum(received))
                rows.append((model_name, tokens, view, statistics.median(times), statistics.median(sizes)))
                print(
                    f"{model_name:8s} {tokens:4d} tokens  {view:10s} median {statistics.median(times):.3f} s "
                    f"(runs {', '.join(f'{t:.2f}' for t in times)}), {statistics.median(sizes) / 1e6:.2f} MB",
                    flush=True,
                )

    print()
    print("| model | tokens | view | Enter -> drawn, median (s) | goal (s) | ratio to goal | websocket payload (MB) |")
    print("|---|---|---|---|---|---|---|")
    for model_name, tokens, view, seconds, size in rows:
        goal = GOALS.get((view, 128)) if tokens >= 120 else None
        goal_text = f"{goal:.1f}" if goal else "-"
        ratio = f"{seconds / goal:.2f}" if goal else "-"
        print(f"| {model_name} | {tokens} | {view} | {seconds:.3f} | {goal_text} | {ratio} | {size / 1e6:.2f} |")


if __name__ == "__main__":
    main()
