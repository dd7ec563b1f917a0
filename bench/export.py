"""Saved views (one self-contained HTML file, ``run.to_html``): their size, and the time Chromium takes to open one
from disk and draw it, offline.

    python -m bench.export [--tokens 128] [--repeats 5] [--json out.json]

Three files, as `render` writes them: MiniLM's head view (6 x 12 heads), MPNet's model view (12 x 12 = 144 heads)
and SmolLM2's model view (30 x 9 = 270 heads), each of a text of exactly ``--tokens`` tokens. Each is opened
``--repeats`` times in Debian Chromium (a new page each time, the variants interleaved, every request refused and
counted: none), and timed in the page from the navigation's start to the first frame in which the view is drawn
(``data-drawn`` of its root, watched by a ``requestAnimationFrame`` loop). Goals (issue 35): the head view of 128
tokens <= 2 MB and <= 1 s; the model view of MPNet <= 5 MB. Weights travel at one byte each (0..255: within 0.5 / 255
of the float32 weight). Prints one table (medians and maxima) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import mha_core as mc
from tools.browser import chromium_page

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "the",
    "mat",
    "because",
    "it",
    "was",
    "tired",
    "and",
    "the",
    "dog",
    "ran",
    "to",
    "the",
    "park",
    "with",
    "a",
    "ball",
]
WATCH_JS = """
window.__hs = {drawnAt: null};
const tick = () => {
  const root = document.querySelector('.hs-headview');
  if (root && root.dataset.drawn) { window.__hs.drawnAt = performance.now(); return; }
  requestAnimationFrame(tick);
};
requestAnimationFrame(tick);
"""
VARIANTS = (("minilm", "head", 2.0), ("mpnet", "model", 5.0), ("smollm2", "model", None))


def text_of(model, tokens: int) -> str:
    """The longest text of ``WORDS`` repeated whose run has at most ``tokens`` tokens (a binary search on words)."""
    words = lambda count: " ".join(WORDS[i % len(WORDS)] for i in range(count))  # noqa: E731
    low, high = 1, 4 * tokens  # low fits; high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if model.run(words(middle)).num_tokens <= tokens else (low, middle)
    return words(low)


def open_and_draw(page, path: Path) -> float:
    """Milliseconds from the navigation's start to the first frame with the view drawn; no request allowed."""
    address = path.resolve().as_uri()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url) if request.url != address else None)
    page.route("**/*", lambda route: route.continue_() if route.request.url == address else route.abort())
    page.add_init_script(WATCH_JS)
    page.goto(address)
    page.wait_for_function("() => window.__hs && window.__hs.drawnAt !== null", timeout=120_000)
    assert requests == [], requests
    return float(page.evaluate("() => window.__hs.drawnAt"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="headscope-export-"))
    files = {}
    for name, view, _ in VARIANTS:
        model = mc.load_model(name)
        run = model.run(text_of(model, args.tokens))
        files[name] = (run, run.to_html(folder / f"{name}-{view}.html", view=view))
    times: dict[str, list[float]] = {name: [] for name, _, _ in VARIANTS}
    for _ in range(args.repeats):
        for name, _, _ in VARIANTS:  # interleaved: the load changes the same for each
            with chromium_page() as page:
                times[name].append(open_and_draw(page, files[name][1]))
    load_after = os.getloadavg()
    rows = []
    print(f"{'file':<22} {'tokens':>6} {'heads':>5} {'MB':>6} {'goal MB':>7} {'draw ms (median)':>16} {'max':>6}")
    for name, view, goal in VARIANTS:
        run, path = files[name]
        size = path.stat().st_size / 2**20
        row = {
            "file": f"{name} {view} view",
            "tokens": run.num_tokens,
            "heads": run.num_layers * run.num_heads,
            "mb": round(size, 2),
            "goal_mb": goal,
            "draw_ms_median": round(statistics.median(times[name])),
            "draw_ms_max": round(max(times[name])),
        }
        rows.append(row)
        print(
            f"{row['file']:<22} {row['tokens']:>6} {row['heads']:>5} {size:>6.2f} {goal or '-':>7} "
            f"{row['draw_ms_median']:>16} {row['draw_ms_max']:>6}"
        )
    print(
        f"load average (1, 5, 15 min): {load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f} before, "
        f"{load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f} after; {os.cpu_count()} cores"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "load": [load_before, load_after]}, indent=2))


if __name__ == "__main__":
    main()
