"""Headscope against BertViz: the same sentence, the same model, the same headless Chromium, end to end.

    pip install --no-deps -r requirements-bench.txt      # BertViz 1.4.1 and IPython, once
    python -m bench.peers [--repeats 5] [--cases head:20,model:20,head:128,model:128] [--json PATH]
                          [--baseline DIR] [--long-repeats K]

MiniLM (6 layers x 12 heads). Contestants, in ONE Chromium (each its own page), alternating every round
(the order rotates from round to round, so load from other processes hits them alike):

headscope  this checkout's ``streamlit run app.py`` (started as tests and bench/browser.py start it,
           ``tools.browser.start_streamlit``), warm: the model loaded and one sentence drawn before timing.
           Timed from Enter in the sentence box until the whole Explore view is drawn. Head view (drawn
           in the browser, ui/headview/): ``tools.browser.head_view_js``, i.e. the component painted the
           sentence holding this round's marker word (its ``data-drawn`` names the sentence's data, the
           layer and the head, and is set after every canvas is painted), every head's canvas labelled
           with the layer, the enlarged head painted and its rows and columns labelled with the tokens;
           and painted since the keypress. A baseline from before the canvas view (Plotly): the 12-head
           grid (every head labelled, the heatmap image painted) and the enlarged head, both showing
           the marker (``--baseline-charts 3`` for checkouts that also drew the lines chart;
           ``--baseline-canvas`` for a baseline with the canvas view). Model view: every layer and
           head labelled and painted. Bytes: every websocket message from Enter until the script is idle.
baseline   (``--baseline DIR``) the same for another checkout of Headscope, e.g. an earlier commit
           (``git worktree add /tmp/headscope-before <commit>``): before/after ratios in one run.
bertviz    BertViz 1.4.1 as its README uses it: the transformers forward pass with
           ``output_attentions=True`` (the same MiniLM weights, eager attention, in this process),
           ``head_view``/``model_view(..., html_action="return")``, the HTML written to a file and opened, until
           drawn: head view, every token on both sides and heads x n^2 attention lines; model view,
           layers x heads x n^2 thumbnail lines. Bytes: the HTML. The JavaScript that HTML loads from
           CDNs (require.js 2.3.6, d3 5.7.0, jQuery 2.x; 2.0.0 is not in the npm registry, 2.1.0 is
           served in its place) is fetched once with ``npm pack`` into bench/out/peers-js/ and served to
           the page through Playwright's request routing; nothing else leaves the machine.

Every round types a NEW sentence (a marker word used once per server, ``bench/browser.py``'s
``sentence``), so no run or figure cache is hit. Times are taken in the page (``performance.now()``):
``end_to_end_s`` from the keypress (Headscope) or from the start of the forward pass (BertViz: the Python
part plus the page's own clock from navigation) until the drawn condition first holds, polled every
animation frame; ``painted_s`` is the browser's share: from the last websocket message that arrived
before drawn (Headscope) or from navigation (BertViz: loading and running the HTML) until drawn.

Layer switch: in the head view, Headscope's layer slider moved one step (ArrowRight) until the view is
drawn for the next layer (the canvas view redraws in the page, then tells the server for the link; a
Plotly baseline waits for a server rerun); BertViz's layer menu changed (in the browser, no server) until
the next animation frame after the redraw.

Prints the load average, a table of medians with ratios (Headscope / BertViz, and after / before with
``--baseline``); ``--json PATH`` writes one row per case and contestant:
``{view, tokens, contestant, end_to_end_s, painted_s, bytes}`` (medians; ``runs`` has every round).
``--long-repeats K`` gives BertViz only K rounds at over 64 tokens (one takes 10 s to minutes on a busy
2-core machine; BertViz is warmed once, on the first case). Nothing is asserted. Goals (issue 16):
Headscope / BertViz <= 0.5 on every row; head view at 20 tokens <= 0.3 s; layer switch at 20 tokens <= 0.3 s.

``--split N`` (Headscope only): N rounds of the 20-token Enter and layer switch, each under a Chrome
DevTools trace and a JavaScript CPU profile, split into server CPU, websocket arrivals, and the page's
main thread (script: Plotly or Streamlit + React; style, layout, paint, GC); medians printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import psutil

from bench.browser import sentence  # a sentence of exactly n tokens
from tools.browser import (
    APP_IDLE_JS,
    SENTENCE_LABEL,
    chromium_launch_options,
    head_view_js,
    model_view_js,
    start_streamlit,
)

ROOT = Path(__file__).resolve().parents[1]

MODEL = "minilm"
CASES = [("head", 20), ("model", 20), ("head", 128), ("model", 128)]
GOALS = "Goals (issue 16): Headscope / BertViz <= 0.5 on every row; head view and layer switch at 20 tokens <= 0.3 s."
VIEWPORT = {"width": 1500, "height": 1100}
TIMEOUT_MS = 300_000

# One marker per timed round and server (MiniLM reads each as one token); never reused, so no cache hits.
MARKERS = [
    "dog",
    "bird",
    "fish",
    "horse",
    "cow",
    "pig",
    "lion",
    "bear",
    "wolf",
    "fox",
    "goat",
    "duck",
    "cat",
    "mouse",
    "frog",
    "owl",
    "deer",
    "seal",
    "whale",
    "shark",
    "crab",
    "snake",
    "tiger",
    "zebra",
    "camel",
    "sheep",
    "eagle",
    "crow",
    "swan",
    "goose",
    "hawk",
    "rabbit",
    "monkey",
    "donkey",
    "spider",
    "bee",
    "ant",
    "moth",
    "lamb",
    "bull",
]

# ---- the JavaScript BertViz's HTML loads from CDNs, fetched from the npm registry once --------------------
JS_CACHE = ROOT / "bench" / "out" / "peers-js"
HTML_FILE = ROOT / "bench" / "out" / "peers-bertviz.html"  # BertViz's page of the current round
# URL (what BertViz's HTML asks for) -> (npm package, file inside the package tarball)
CDN_FILES = {
    "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js": ("requirejs@2.3.6", "package/require.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min.js": ("d3@5.7.0", "package/dist/d3.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min.js": ("jquery@2.1.0", "package/dist/jquery.min.js"),
}


def cdn_scripts() -> dict[str, bytes]:
    """URL -> script bytes, from bench/out/peers-js (filled with ``npm pack`` the first time)."""
    JS_CACHE.mkdir(parents=True, exist_ok=True)
    scripts = {}
    for url, (package, member) in CDN_FILES.items():
        target = JS_CACHE / f"{package.replace('@', '-')}.js"
        if not target.exists():
            with tempfile.TemporaryDirectory() as folder:
                subprocess.run(["npm", "pack", "--silent", package], cwd=folder, check=True, capture_output=True)
                (tarball,) = Path(folder).glob("*.tgz")
                with tarfile.open(tarball) as archive:
                    data = archive.extractfile(member).read()
            target.write_bytes(data)
        scripts[url] = target.read_bytes()
    return scripts


# ---- timing inside the page -------------------------------------------------------------------------
# Installed before any page script: every websocket message's arrival time and size, and the time of the
# last Enter / arrow key (the start of a Headscope interaction), on the page's own clock.
PAGE_CLOCK_JS = """
(() => {
  window.__bench = {frames: [], t0: null};
  const Native = window.WebSocket;
  if (Native) {
    window.WebSocket = class extends Native {
      constructor(...args) {
        super(...args);
        this.addEventListener('message', event => {
          const d = event.data;
          window.__bench.frames.push([performance.now(), d.byteLength ?? d.size ?? d.length ?? 0]);
        });
      }
    };
  }
  window.addEventListener('keydown', event => {
    if (['Enter', 'ArrowRight', 'ArrowLeft'].includes(event.key)) window.__bench.t0 = performance.now();
  }, true);
})();
"""


def when_drawn(predicate: str) -> str:
    """``predicate`` that also notes the page time it first held (``__bench.drawn``)."""
    return (
        f"() => {{ if (({predicate})()) {{ window.__bench.drawn = performance.now(); return true; }} return false; }}"
    )


def headscope_head_js(num_heads: int, layer: int, marker: str, charts: int = 2) -> str:
    """Explore's head view complete: the grid of ``layer`` (every head labelled, painted) and the enlarged
    head (its heatmap painted, or its lines' token labels drawn), ``charts`` charts in all (3 before the
    enlarged head showed its heatmap OR its lines: ``--baseline-charts 3``); all show ``marker`` and were
    redrawn since ``__bench.old`` was noted."""
    return f"""
() => {{
  const gds = Array.from(document.querySelectorAll('.js-plotly-plot'));
  if (gds.length !== {charts}) return false;
  const old = window.__bench.old || [];
  return gds.every(gd => {{
    const data = gd._fullData || [];
    if (!data.length || old.includes(data[0])) return false;
    const labels = data.flatMap(t => Array.from(t.x || []).concat(Array.from(t.text || [])).map(String));
    if (!labels.some(c => c === {marker!r} || c.endsWith(' ' + {marker!r}))) return false;
    const title = (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '';
    if (title.includes('heads')) {{
      if (!title.startsWith('Layer {layer}: all {num_heads} heads')) return false;
      const heads = Array.from(gd.querySelectorAll('g.annotation text')).filter(t => /^head \\d+$/.test(t.textContent));
      if (heads.length !== {num_heads}) return false;
    }}
    return gd.querySelectorAll('g.hm image').length === 1 || gd.querySelectorAll('g.textpoint text').length > 0;
  }});
}}
"""


def painted_since_noted(predicate: str) -> str:
    """``predicate`` (a JS function) once the component has painted since ``__bench.oldDrawn`` was noted
    (its ``data-drawn`` names the sentence's data and what is shown)."""
    return f"""
() => {{
  const root = document.querySelector('.hs-headview');
  if (!root || root.dataset.drawn === window.__bench.oldDrawn) return false;
  return ({predicate})();
}}
"""


def headscope_canvas_js(num_heads: int, layer: int, marker: str) -> str:
    """Explore's head view drawn in the browser (ui/headview/): ``tools.browser.head_view_js`` (every head's
    canvas painted with the sentence holding ``marker`` and labelled with ``layer``, the enlarged head
    painted and its rows and columns labelled with the sentence's tokens), painted since noted."""
    return painted_since_noted(head_view_js(num_heads, marker, layer))


def headscope_model_js(num_layers: int, num_heads: int, marker: str) -> str:
    """Explore's model view drawn in the browser (ui/headview/): ``tools.browser.model_view_js`` (every tile
    painted with the sentence holding ``marker``, every layer and head labelled), painted since noted."""
    return painted_since_noted(model_view_js(num_layers, num_heads, marker))


def headscope_plotly_model_js(num_layers: int, num_heads: int, marker: str) -> str:
    """Explore's Plotly model view (checkouts before the model view was drawn in the browser,
    ``--baseline-plotly-model``) complete: every layer and head labelled, painted, showing ``marker``."""
    return f"""
() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(gd => {{
  const title = (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '';
  if (!title.startsWith('All {num_layers} layers x {num_heads} heads')) return false;
  const trace = (gd._fullData || [])[0];
  if (!trace || !trace.x || !Array.from(trace.x).some(c => String(c).endsWith(' ' + {marker!r}))) return false;
  const labels = Array.from(gd.querySelectorAll('g.annotation text')).map(t => t.textContent);
  return labels.filter(t => /^head \\d+$/.test(t)).length === {num_heads}
      && labels.filter(t => /^layer \\d+$/.test(t)).length === {num_layers}
      && gd.querySelectorAll('g.hm image').length === 1;
}})
"""


def bertviz_head_js(num_heads: int, n: int, marker: str) -> str:
    """BertViz's head view complete: n tokens on each side (the right side shows ``marker``), heads x n^2 lines."""
    return f"""
() => document.querySelectorAll('#vis #left text').length === {n}
   && document.querySelectorAll('#vis #right text').length === {n}
   && Array.from(document.querySelectorAll('#vis #right text')).some(t => t.textContent.trim() === {marker!r})
   && document.querySelectorAll('#vis #attention line').length === {num_heads * n * n}
"""


def bertviz_model_js(num_layers: int, num_heads: int, n: int) -> str:
    """BertViz's model view complete: layers x heads thumbnails of n^2 lines each."""
    return f"() => document.querySelectorAll('#vis svg line').length >= {num_layers * num_heads * n * n}"


# BertViz switches layers in the browser: the menu changed, timed until the frame after the redraw.
BERTVIZ_LAYER_SWITCH_JS = """
async (layer) => {
  const menu = document.querySelector('#layer');
  const t0 = performance.now();
  menu.value = String(layer);
  menu.dispatchEvent(new Event('change', {bubbles: true}));
  await new Promise(resolve => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  return (performance.now() - t0) / 1000;
}
"""


# ---- contestants ----------------------------------------------------------------------------------------
@dataclass
class Measurement:
    end_to_end_s: float
    painted_s: float
    bytes: int
    server_cpu_s: float = float("nan")  # Headscope: the server process's CPU; BertViz: this process's (Python)
    browser_cpu_s: float = float("nan")  # the page's renderer main thread busy (CDP TaskDuration)


def browser_busy(page) -> float:
    """Seconds the page's renderer main thread has been busy so far (Chrome DevTools ``TaskDuration``)."""
    session = getattr(page, "_bench_cdp", None)
    if session is None:
        session = page._bench_cdp = page.context.new_cdp_session(page)
        session.send("Performance.enable")
    metrics = session.send("Performance.getMetrics")["metrics"]
    return next(m["value"] for m in metrics if m["name"] == "TaskDuration")


def process_cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system + sum(c.cpu_times().user + c.cpu_times().system for c in process.children())


@dataclass
class Headscope:
    """One Headscope server (this checkout or ``--baseline``) and its own page."""

    name: str
    url: str
    page: object
    process: object  # psutil.Process of the server
    num_layers: int
    num_heads: int
    charts: int = 2  # Plotly charts in the head view (3 before the enlarged head showed its heatmap OR its lines)
    canvas: bool = True  # the head view drawn in the browser (ui/headview/); False: Plotly (``charts``)
    plotly_model: bool = False  # the model view is a Plotly chart (checkouts before ui/headview.py drew it)
    markers: list[str] = field(default_factory=lambda: list(MARKERS))

    def marker(self) -> str:
        return self.markers.pop(0)

    def open(self, view: str, text: str, marker: str) -> None:
        """Open Explore in ``view`` with ``text`` (untimed) and wait until drawn and idle."""
        query = {"model": MODEL, "text": text, "page": "explore", **({"view": "model"} if view == "model" else {})}
        self.page.goto(f"{self.url}/?{urlencode(query)}")
        self.page.wait_for_function(when_drawn(self.predicate(view, marker)), timeout=TIMEOUT_MS, polling="raf")
        self.page.wait_for_function(APP_IDLE_JS, timeout=TIMEOUT_MS)

    def predicate(self, view: str, marker: str, layer: int = 0) -> str:
        if view == "model":
            if self.plotly_model:
                return headscope_plotly_model_js(self.num_layers, self.num_heads, marker)
            return headscope_model_js(self.num_layers, self.num_heads, marker)
        if self.canvas:
            return headscope_canvas_js(self.num_heads, layer, marker)
        return headscope_head_js(self.num_heads, layer, marker, self.charts)

    def layer_slider(self):
        """The head view's layer slider: the component's own (canvas), or Streamlit's select_slider."""
        if self.canvas:
            return self.page.locator(".hs-headview .hs-slider")
        return self.page.locator('[data-testid="stSlider"]').filter(has_text="Layer").get_by_role("slider")

    def _timed(self, act, predicate: str) -> Measurement:
        self.page.evaluate(
            "() => { window.__bench.frames = []; window.__bench.t0 = null; window.__bench.drawn = null; "
            "window.__bench.old = Array.from(document.querySelectorAll('.js-plotly-plot'))"
            ".map(gd => (gd._fullData || [])[0]); "
            "window.__bench.oldDrawn = (document.querySelector('.hs-headview') || {dataset: {}}).dataset.drawn; }"
        )
        cpu, busy = process_cpu(self.process), browser_busy(self.page)
        act()
        self.page.wait_for_function(when_drawn(predicate), timeout=TIMEOUT_MS, polling="raf")
        self.page.wait_for_function(APP_IDLE_JS, timeout=TIMEOUT_MS)
        cpu, busy = process_cpu(self.process) - cpu, browser_busy(self.page) - busy
        clock = self.page.evaluate("() => window.__bench")
        drawn, start = clock["drawn"], clock["t0"]
        before = [t for t, _ in clock["frames"] if t <= drawn]
        return Measurement(
            end_to_end_s=(drawn - start) / 1000,
            painted_s=(drawn - max(before)) / 1000 if before else float("nan"),
            bytes=int(sum(size for t, size in clock["frames"] if t >= start)),
            server_cpu_s=cpu,
            browser_cpu_s=busy,
        )

    def enter(self, view: str, text: str, marker: str) -> Measurement:
        box = self.page.get_by_label(SENTENCE_LABEL, exact=True)
        box.fill(text)
        return self._timed(lambda: box.press("Enter"), self.predicate(view, marker))

    def switch_layer(self, marker: str, layer: int) -> Measurement:
        """Move the layer slider from ``layer - 1`` to ``layer`` with the keyboard (the canvas view redraws in
        the page; the Plotly view waits for a server rerun)."""
        thumb = self.layer_slider()
        thumb.focus()
        return self._timed(lambda: thumb.press("ArrowRight"), self.predicate("head", marker, layer))

    def back_to_layer_0(self, marker: str) -> None:
        """Untimed, after a layer switch: back to layer 0, so the next round starts where this one did."""
        self.page.evaluate("() => { window.__bench.oldDrawn = null; }")
        self.layer_slider().press("ArrowLeft")
        self.page.wait_for_function(when_drawn(self.predicate("head", marker, 0)), timeout=TIMEOUT_MS, polling="raf")
        self.page.wait_for_function(APP_IDLE_JS, timeout=TIMEOUT_MS)


@dataclass
class BertViz:
    """BertViz 1.4.1 on the same MiniLM weights; its HTML served to its own page."""

    page: object
    model: object  # mha_core LoadedModel: its transformers model and tokenizer, as BertViz's README uses them
    html: bytes = b""

    def __post_init__(self) -> None:
        scripts = cdn_scripts()

        def serve(route) -> None:
            url = route.request.url
            if url.startswith("file:"):
                route.continue_()
            elif url in scripts:
                route.fulfill(status=200, content_type="application/javascript", body=scripts[url])
            else:
                route.abort()

        self.page.route("**/*", serve)

    def render(self, view: str, text: str) -> tuple[bytes, int, float, float]:
        """The forward pass and BertViz's HTML: (html, tokens, seconds, CPU seconds)."""
        import torch
        from bertviz import head_view, model_view

        start, cpu = time.perf_counter(), time.process_time()
        inputs = self.model.tokenizer.encode(text, return_tensors="pt")
        with torch.inference_mode():
            attention = self.model.hf_model(inputs, output_attentions=True).attentions
        tokens = self.model.tokenizer.convert_ids_to_tokens(inputs[0])
        html = (head_view if view == "head" else model_view)(attention, tokens, html_action="return").data
        data = html.encode("utf-8")
        return data, len(tokens), time.perf_counter() - start, time.process_time() - cpu

    def show(self, view: str, text: str, marker: str) -> Measurement:
        self.html, n, python_s, python_cpu = self.render(view, text)
        # Opened as a file: the browser reads it natively, as a notebook's page gets its output, rather than
        # through Playwright's request routing (which copies a body through its driver: minutes for 53 MB).
        start = time.perf_counter()
        HTML_FILE.write_bytes(self.html)
        python_s += time.perf_counter() - start
        predicate = (
            bertviz_head_js(self.model.num_heads, n, marker)
            if view == "head"
            else bertviz_model_js(self.model.num_layers, self.model.num_heads, n)
        )
        self.page.goto(HTML_FILE.as_uri(), wait_until="commit", timeout=TIMEOUT_MS)
        self.page.wait_for_function(
            f"() => {{ if (({predicate})()) {{ window.__drawnAt = performance.now(); return true; }} return false; }}",
            timeout=TIMEOUT_MS,
            polling="raf",
        )
        page_s = self.page.evaluate("() => window.__drawnAt") / 1000
        return Measurement(
            end_to_end_s=python_s + page_s,
            painted_s=page_s,
            bytes=len(self.html),
            server_cpu_s=python_cpu,
            # A new document (on another site: a new renderer) counts from zero.
            browser_cpu_s=browser_busy(self.page),
        )

    def switch_layer(self, layer: int) -> Measurement:
        busy = browser_busy(self.page)
        seconds = self.page.evaluate(BERTVIZ_LAYER_SWITCH_JS, layer)
        return Measurement(
            end_to_end_s=seconds,
            painted_s=seconds,
            bytes=0,
            server_cpu_s=0.0,
            browser_cpu_s=browser_busy(self.page) - busy,
        )


# ---- where a 20-token Enter goes (--split) -------------------------------------------------------------------
TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute", "blink.user_timing"]
PAINT_EVENTS = {
    "Paint",
    "PrePaint",
    "Layerize",
    "Commit",
    "UpdateLayer",
    "PaintImage",
    "Decode Image",
    "UpdateLayerTree",
}
# The page clock's Enter and drawn, as marks in the trace (so trace and page agree on the window).
MARK_WINDOW_JS = (
    "() => { const b = window.__bench; performance.mark('bench_key', {startTime: b.t0}); "
    "performance.mark('bench_drawn', {startTime: b.drawn}); }"
)


def main_thread_split(trace: bytes) -> dict[str, float]:
    """Milliseconds of the page's main thread between Enter and drawn, by self time of the trace's events:
    busy (top-level tasks), style, layout, paint and GC; the rest of busy is script and task overhead."""
    events = json.loads(trace)["traceEvents"]
    marks = {e["name"]: e for e in events if e.get("name") in ("bench_key", "bench_drawn")}
    lo, hi = marks["bench_key"]["ts"], marks["bench_drawn"]["ts"]
    thread = (marks["bench_key"]["pid"], marks["bench_key"]["tid"])
    spans = sorted(
        (
            e
            for e in events
            if (e["pid"], e["tid"]) == thread and e.get("ph") == "X" and e["ts"] < hi and e["ts"] + e.get("dur", 0) > lo
        ),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    own: dict[str, float] = {}
    stack: list[dict] = []
    busy = 0.0
    for event in spans:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= event["ts"]:
            stack.pop()
        width = max(0.0, min(event["ts"] + event["dur"], hi) - max(event["ts"], lo))
        if stack:
            own[stack[-1]["name"]] = own.get(stack[-1]["name"], 0.0) - width
        else:
            busy += width
        own[event["name"]] = own.get(event["name"], 0.0) + width
        stack.append(event)
    split = {"window": (hi - lo) / 1e3, "busy": busy / 1e3, "style": 0.0, "layout": 0.0, "paint": 0.0, "gc": 0.0}
    for name, width in own.items():
        part = (
            "style"
            if name == "UpdateLayoutTree"
            else "layout"
            if name == "Layout"
            else "paint"
            if name in PAINT_EVENTS
            else "gc"
            if "GC" in name
            else None
        )
        if part:
            split[part] += width / 1e3
    split["script and tasks"] = split["busy"] - split["style"] - split["layout"] - split["paint"] - split["gc"]
    return split, lo, hi


def js_split(profile: dict, lo: float, hi: float) -> dict[str, float]:
    """Milliseconds of JavaScript samples between ``lo`` and ``hi`` (trace clock, microseconds) by the
    bundle of the innermost frame that has one: Plotly (Streamlit's PlotlyChart chunk, with the DOM calls
    it makes, e.g. forced layouts), Streamlit's React app (every other chunk); and the profiler's own
    (program) (native work outside JavaScript), (garbage collector), (idle)."""
    nodes = {node["id"]: node for node in profile["nodes"]}
    parent = {child: node["id"] for node in profile["nodes"] for child in node.get("children", [])}
    split: dict[str, float] = {}
    t = profile["startTime"]
    times = []
    for delta in profile["timeDeltas"]:
        t += delta
        times.append(t)
    for index in range(len(times) - 1):
        if not lo <= times[index] <= hi:
            continue
        node_id, part = profile["samples"][index], None
        leaf = nodes[node_id]["callFrame"]["functionName"]
        while node_id is not None and part is None:
            url = nodes[node_id]["callFrame"].get("url", "")
            if url:
                if "/PlotlyChart." in url:
                    part = "Plotly"
                elif url.startswith(("blob:", "data:")):
                    part = "head view component"  # ui/headview/headview.js, loaded by Streamlit as a module
                else:
                    part = "Streamlit + React"
            node_id = parent.get(node_id)
        part = part or (leaf if leaf.startswith("(") else "(program)")
        split[part] = split.get(part, 0.0) + (times[index + 1] - times[index]) / 1e3
    return split


def split_run(args, model) -> None:
    """``--split N``: N rounds of a 20-token Enter and a layer switch in Headscope's head view, each with a
    Chrome trace (main-thread events) and a JavaScript CPU profile; prints where the time went. With
    ``--baseline DIR``, of that checkout instead (its head view has ``--baseline-charts`` charts)."""
    from playwright.sync_api import sync_playwright

    rows: dict[str, list[dict]] = {"Enter": [], "layer switch": []}
    print(f"load average at start: {load_average()} ({os.cpu_count()} cores)", flush=True)
    root = args.baseline.resolve() if args.baseline else ROOT
    env = {"PYTHONPATH": str(root)} if root != ROOT else {}
    with sync_playwright() as playwright, start_streamlit(root=root, env=env) as server:
        browser = playwright.chromium.launch(**chromium_launch_options())
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.add_init_script(PAGE_CLOCK_JS)
        session = page.context.new_cdp_session(page)
        charts = args.baseline_charts if args.baseline else 2
        headscope = Headscope(
            "headscope",
            server.url,
            page,
            psutil.Process(server.pid),
            model.num_layers,
            model.num_heads,
            charts,
            canvas=not args.baseline or args.baseline_canvas,
            plotly_model=bool(args.baseline) and args.baseline_plotly_model,
        )
        marker = headscope.marker()
        headscope.open("head", sentence(model, marker, 20)[0], marker)

        def traced(what: str, act) -> None:
            page.wait_for_timeout(300)
            session.send("Profiler.enable")
            session.send("Profiler.setSamplingInterval", {"interval": 200})
            session.send("Profiler.start")
            browser.start_tracing(page=page, categories=TRACE_CATEGORIES)
            result = act()
            clock = page.evaluate("() => window.__bench")
            page.evaluate(MARK_WINDOW_JS)
            trace = browser.stop_tracing()
            profile = session.send("Profiler.stop")["profile"]
            split, lo, hi = main_thread_split(trace)
            frames = [(t - clock["t0"], size) for t, size in clock["frames"] if t >= clock["t0"]]
            row = {
                "end to end": result.end_to_end_s * 1e3,
                "server CPU": result.server_cpu_s * 1e3,
                "first message": min((t for t, _ in frames), default=float("nan")),
                "figure message": max(frames, key=lambda f: f[1])[0] if frames else float("nan"),
                "last message": max((t for t, _ in frames), default=float("nan")),
                "messages": len(frames),
                **split,
                **{f"JS: {k}": v for k, v in js_split(profile, lo, hi).items()},
            }
            rows[what].append(row)
            print(f"  {what}: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items()), flush=True)

        for _ in range(args.split):
            marker = headscope.marker()
            text = sentence(model, marker, 20)[0]
            traced("Enter", lambda text=text, marker=marker: headscope.enter("head", text, marker))
            traced("layer switch", lambda marker=marker: headscope.switch_layer(marker, 1))
            headscope.back_to_layer_0(marker)
        browser.close()
    print(f"\nload average at end: {load_average()}; medians of {args.split} rounds, MiniLM, 20 tokens, head view\n")
    keys = list(dict.fromkeys(k for runs in rows.values() for row in runs for k in row))
    print("| ms after Enter (or in the window) | Enter | layer switch |\n|---|---|---|")
    for key in keys:
        cells = [median([row.get(key, 0.0) for row in rows[what]]) for what in rows]
        print(f"| {key} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")


# ---- the run -----------------------------------------------------------------------------------------------
def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(f"{v}:{n}" for v, n in CASES), help="view:tokens, comma-separated")
    parser.add_argument(
        "--long-repeats",
        type=int,
        help="BertViz's rounds for cases over 64 tokens (each takes 10 s to minutes); default --repeats",
    )
    parser.add_argument("--no-layer-switch", action="store_true", help="skip the layer-switch rows")
    parser.add_argument("--no-bertviz", action="store_true", help="Headscope (and --baseline) only")
    parser.add_argument("--baseline", type=Path, help="another checkout of Headscope to time beside this one")
    parser.add_argument(
        "--baseline-charts",
        type=int,
        default=2,
        help="charts in the baseline's head view (3 for checkouts before the heatmap / lines switch)",
    )
    parser.add_argument(
        "--baseline-canvas",
        action="store_true",
        help="the baseline's head view is the canvas one too (default: Plotly, checkouts before ui/headview.py)",
    )
    parser.add_argument(
        "--baseline-plotly-model",
        action="store_true",
        help="the baseline's model view is a Plotly chart (checkouts before ui/headview.py drew it)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--bertviz-threads",
        type=int,
        default=1,
        help="torch threads for BertViz's forward pass (1: as Headscope's server runs it, HEADSCOPE_TORCH_THREADS)",
    )
    parser.add_argument(
        "--split",
        type=int,
        metavar="N",
        help="instead of the comparison: N traced rounds of Headscope's 20-token head view (Enter, layer switch), "
        "split into server, websocket, script (Plotly, Streamlit + React), style, layout, paint",
    )
    args = parser.parse_args()
    if args.split:
        from mha_core.models import load_model

        split_run(args, load_model(MODEL))
        return
    cases = [(item.split(":")[0], int(item.split(":")[1])) for item in args.cases.split(",")]
    if (args.repeats + 1) * len(cases) > len(MARKERS):
        parser.error(f"at most {len(MARKERS) // len(cases) - 1} repeats for {len(cases)} cases")

    import torch
    from playwright.sync_api import sync_playwright

    from mha_core.models import load_model

    torch.set_num_threads(args.bertviz_threads)
    model = load_model(MODEL)
    texts = {}  # (marker, tokens) -> text
    servers = [("headscope", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    print(
        f"load average at start: {load_average()} ({os.cpu_count()} cores); BertViz's forward pass with "
        f"{torch.get_num_threads()} torch thread(s)",
        flush=True,
    )

    samples: dict[tuple[str, int, str], list[Measurement]] = {}
    token_counts: dict[tuple[str, int], int] = {}
    with sync_playwright() as playwright, contextlib.ExitStack() as stack:
        browser = playwright.chromium.launch(**chromium_launch_options())
        stack.callback(browser.close)
        contestants: dict[str, object] = {}
        for name, root in servers:
            env = {"PYTHONPATH": str(root)} if root != ROOT else {}
            server = stack.enter_context(start_streamlit(root=root, env=env))
            page = browser.new_context(viewport=VIEWPORT).new_page()  # own context: own renderer, own session
            page.add_init_script(PAGE_CLOCK_JS)
            contestants[name] = Headscope(
                name,
                server.url,
                page,
                psutil.Process(server.pid),
                model.num_layers,
                model.num_heads,
                charts=args.baseline_charts if name == "baseline" else 2,
                canvas=name != "baseline" or args.baseline_canvas,
                plotly_model=name == "baseline" and args.baseline_plotly_model,
            )
        if not args.no_bertviz:
            contestants["bertviz"] = BertViz(browser.new_context(viewport=VIEWPORT).new_page(), model)

        def text_for(marker: str, tokens: int) -> str:
            if (marker, tokens) not in texts:
                texts[(marker, tokens)], token_counts[(marker, tokens)] = sentence(model, marker, tokens)
            return texts[(marker, tokens)]

        long_repeats = args.repeats if args.long_repeats is None else args.long_repeats
        for case_index, (view, tokens) in enumerate(cases):
            # Warm: every contestant draws this case once, untimed (for Headscope: the view opened by link;
            # BertViz once, on the first case: its imports and first forward pass).
            for contestant in contestants.values():
                if isinstance(contestant, Headscope):
                    marker = contestant.marker()
                    contestant.open(view, text_for(marker, tokens), marker)
                elif case_index == 0:
                    contestant.show(view, text_for("cat", tokens), "cat")
            order = list(contestants)
            for round_index in range(args.repeats):
                shift = round_index % len(order)
                for name in order[shift:] + order[:shift]:
                    if name == "bertviz" and tokens > 64 and round_index >= long_repeats:
                        continue
                    contestant = contestants[name]
                    if isinstance(contestant, Headscope):
                        marker = contestant.marker()
                        result = contestant.enter(view, text_for(marker, tokens), marker)
                        if view == "head" and tokens <= 32 and not args.no_layer_switch:
                            samples.setdefault(("layer switch", tokens, name), []).append(
                                contestant.switch_layer(marker, 1)
                            )
                            contestant.back_to_layer_0(marker)
                    else:
                        marker = MARKERS[round_index]
                        result = contestant.show(view, text_for(marker, tokens), marker)
                        if view == "head" and tokens <= 32 and not args.no_layer_switch:
                            samples.setdefault(("layer switch", tokens, name), []).append(contestant.switch_layer(1))
                    samples.setdefault((view, tokens, name), []).append(result)
                    print(
                        f"  {view:5s} {tokens:4d} {name:9s} round {round_index + 1}: "
                        f"{result.end_to_end_s:.3f} s end to end, {result.painted_s:.3f} s painting, "
                        f"{result.bytes / 1e6:.2f} MB; CPU {result.server_cpu_s:.3f} s server/Python, "
                        f"{result.browser_cpu_s:.3f} s browser",
                        flush=True,
                    )

    rows = []
    for (view, tokens, name), runs in samples.items():
        rows.append(
            {
                "view": view,
                "tokens": max(count for (_, t), count in token_counts.items() if t == tokens),
                "contestant": name,
                "end_to_end_s": median([r.end_to_end_s for r in runs]),
                "painted_s": median([r.painted_s for r in runs]),
                "bytes": int(median([r.bytes for r in runs])),
                "server_cpu_s": median([r.server_cpu_s for r in runs]),
                "browser_cpu_s": median([r.browser_cpu_s for r in runs]),
                "runs": [r.end_to_end_s for r in runs],
            }
        )
    print(f"\nload average at end: {load_average()}; medians of {args.repeats} rounds, MiniLM (6 x 12)", end="")
    print(f" (BertViz over 64 tokens: {long_repeats})\n" if long_repeats != args.repeats else "\n")
    print_table(rows)
    print(GOALS)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def print_table(rows: list[dict]) -> None:
    """Two Markdown tables: wall time (end to end, painting, bytes) and CPU (server or Python, browser)."""
    by_case: dict[tuple[str, int], dict[str, dict]] = {}
    for row in rows:
        by_case.setdefault((row["view"], row["tokens"]), {})[row["contestant"]] = row
    names = [n for n in ("headscope", "baseline", "bertviz") if any(n in c for c in by_case.values())]
    pairs = [
        ("headscope", other, label)
        for other, label in (("bertviz", "Headscope / BertViz"), ("baseline", "after / before"))
        if other in names
    ]

    def table(columns: list[tuple[str, str, float, int]], total) -> None:
        header = ["view", "tokens"] + [f"{name} {label}" for name in names for _, label, _, _ in columns]
        header += [label for _, _, label in pairs]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for (view, tokens), case in by_case.items():
            line = [view, str(tokens)]
            for name in names:
                for key, _, scale, digits in columns:
                    line.append(f"{case[name][key] / scale:.{digits}f}" if name in case else "-")
            for mine, other, _ in pairs:
                line.append(f"{total(case[mine]) / total(case[other]):.2f}" if mine in case and other in case else "-")
            print("| " + " | ".join(line) + " |")
        print()

    print("Wall time, Enter (or the forward pass) -> drawn; ratios of end to end:\n")
    table(
        [("end_to_end_s", "(s)", 1.0, 3), ("painted_s", "painting (s)", 1.0, 3), ("bytes", "MB", 1e6, 2)],
        lambda row: row["end_to_end_s"],
    )
    print(
        "CPU seconds per view (server process or BertViz's Python; the page's renderer main thread); ratios of the sum:\n"
    )
    table(
        [("server_cpu_s", "server (s)", 1.0, 3), ("browser_cpu_s", "browser (s)", 1.0, 3)],
        lambda row: row["server_cpu_s"] + row["browser_cpu_s"],
    )


if __name__ == "__main__":
    main()
