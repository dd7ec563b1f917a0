"""The long-document view in Debian Chromium at 4,096 tokens: the overviews after the pass, then zoom and pan steps.

    python -m bench.long_browser [--tokens 4096] [--repeats 5] [--model smollm2]

One ``streamlit run app.py`` server and one browser. The document is the long examples (assets/long, CC BY-SA;
``mha_core.models.long.haystack``) cut to exactly ``--tokens`` tokens of the model and pasted into Explore's
long-document box; "Read every head" starts the pass (its progress bar showing). Measured in the page, by a ``requestAnimationFrame`` loop:

- overviews: from the last frame that still showed the pass's progress bar to the first frame in which the layer's
  overviews are drawn (``data-drawn`` of ``.hs-longview`` set); goal <= 1 s;
- zoom: a drag over 15 x 15 cells of the whole head (480 x 480 tokens), then over 16 x 16 cells of that (single
  tokens, 60 x 60), and back to the whole head; pan: three pan buttons at token level; each from the gesture
  (mouse up or click) to the frame with the new region drawn; goal <= 0.3 s a step.

Prints one table (medians and maxima) and the load average; ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from mha_core.models.long import haystack
from tools.browser import chromium_page, start_streamlit, wait_for_app
from ui.longview import TOKEN_LEVEL

ROOT = ".hs-longview"
WATCH_JS = """() => {
  window.__hs = {progressSeen: null, drawnAt: null, drawn: ''};
  const tick = () => {
    const now = performance.now();
    if (document.querySelector('[data-testid="stProgress"]')) window.__hs.progressSeen = now;
    const r = document.querySelector('.hs-longview');
    const drawn = r ? (r.dataset.drawn || '') : '';
    if (drawn && drawn !== window.__hs.drawn) { window.__hs.drawn = drawn; window.__hs.drawnAt = now; }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""
STATE_JS = "() => window.__hs"


def document_of(model, tokens: int) -> str:
    """The haystack cut at the longest prefix (whole characters) of exactly ``tokens`` tokens, or just under."""
    text = haystack()
    low, high = 0, len(text)
    while low < high:  # the longest prefix with at most ``tokens`` tokens
        middle = (low + high + 1) // 2
        if len(model.encode_long(text[:middle]).input_ids) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def wait_new_drawing(page, before: str, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(
        "(before) => window.__hs && window.__hs.drawn && window.__hs.drawn !== before", arg=before, timeout=timeout_ms
    )


def step(page, gesture) -> tuple[float, str]:
    """Seconds from the gesture's end to the frame that drew the new region, and that drawing's signature."""
    before = page.evaluate(STATE_JS)["drawn"]
    gesture()
    start = page.evaluate("() => performance.now()")
    wait_new_drawing(page, before)
    state = page.evaluate(STATE_JS)
    return (state["drawnAt"] - start) / 1000.0, state["drawn"]


def drag(page, first: tuple[float, float], last: tuple[float, float]):
    """A drag on the zoomed head from cell ``first`` to cell ``last`` (column, row in cells of the big canvas)."""

    def gesture():
        box = page.locator(".hs-lv-big").bounding_box()
        cell = box["width"] / 128
        page.mouse.move(box["x"] + first[0] * cell, box["y"] + first[1] * cell)
        page.mouse.down()
        page.mouse.move(box["x"] + (first[0] + last[0]) / 2 * cell, box["y"] + (first[1] + last[1]) / 2 * cell, steps=3)
        page.mouse.move(box["x"] + last[0] * cell, box["y"] + last[1] * cell, steps=3)
        page.mouse.up()

    return gesture


def click(page, selector: str):
    return lambda: page.locator(selector).first.click()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--screenshots", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    import mha_core as mc  # after the arguments: --help answers without loading torch

    model = mc.load_model(args.model)
    text = document_of(model, args.tokens)
    n = len(model.encode_long(text).input_ids)
    del model
    args.screenshots.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    results: dict = {"tokens": n, "model": args.model, "load_average_start": load_start}
    with start_streamlit(env={"HEADSCOPE_CACHE_BUDGET_MB": "4096"}) as server, chromium_page() as page:
        page.goto(f"{server.url}/?page=explore&model={args.model}&long=paste")
        wait_for_app(page)
        box = page.get_by_label("Your document")
        box.fill(text)
        box.press("Control+Enter")
        wait_for_app(page)
        page.evaluate(WATCH_JS)
        started = time.perf_counter()
        page.get_by_role("button", name="Read every head of this document").click()
        wait_new_drawing(page, "", timeout_ms=900_000)
        results["pass_and_view_s"] = time.perf_counter() - started
        state = page.evaluate(STATE_JS)
        if state["progressSeen"] is None:
            raise RuntimeError("the pass's progress bar never showed: the run came from a cache")
        results["overviews_after_pass_s"] = (state["drawnAt"] - state["progressSeen"]) / 1000.0
        page.locator(ROOT).scroll_into_view_if_needed()
        page.screenshot(path=str(args.screenshots / f"long-{n}-overview.png"), full_page=True)
        steps: dict[str, list[float]] = {
            "zoom to 480 tokens": [],
            "zoom to single tokens": [],
            "pan": [],
            "zoom out": [],
        }
        for repeat in range(args.repeats):
            offset = 8 * repeat  # another region each time: nothing is answered from the browser's memory
            seconds, _ = step(page, drag(page, (40.5 + offset, 60.5 + offset), (55.5 + offset, 75.5 + offset)))
            steps["zoom to 480 tokens"].append(seconds)
            seconds, drawn = step(page, drag(page, (50.5, 50.5), (65.5, 65.5)))  # 16 cells of 3.75 tokens
            rows, cols = (tuple(int(v) for v in part.split("-")) for part in drawn.split(":")[3:5])
            if max(rows[1] - rows[0], cols[1] - cols[0]) > TOKEN_LEVEL:
                raise RuntimeError(f"the second drag did not reach single tokens: {drawn!r}")
            steps["zoom to single tokens"].append(seconds)
            if repeat == 0:
                page.screenshot(path=str(args.screenshots / f"long-{n}-tokens.png"), full_page=True)
            for selector in (".hs-lv-pan-right", ".hs-lv-pan-down", ".hs-lv-pan-left"):
                seconds, _ = step(page, click(page, selector))
                steps["pan"].append(seconds)
            seconds, _ = step(page, click(page, ".hs-lv-whole"))
            steps["zoom out"].append(seconds)
        if page.locator('[data-testid="stException"]').count():
            raise RuntimeError("the page shows an exception")
    results["steps"] = steps
    results["load_average_end"] = os.getloadavg()
    print(
        f"{args.model}, {n} tokens; load average at the start "
        + ", ".join(f"{v:.1f}" for v in load_start)
        + ", at the end "
        + ", ".join(f"{v:.1f}" for v in results["load_average_end"])
    )
    print(f"pass and first view: {results['pass_and_view_s']:.1f} s")
    print("| what | goal (s) | median (s) | max (s) | count |")
    print("|---|---|---|---|---|")
    print(f"| layer's overviews drawn after the pass | 1.0 | {results['overviews_after_pass_s']:.3f} | | 1 |")
    for name, values in steps.items():
        print(f"| {name} | 0.3 | {statistics.median(values):.3f} | {max(values):.3f} | {len(values)} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
