"""Drive the app in Debian Chromium: start `streamlit run serve.py` (app.py behind ui.server) on a free loopback port, open pages with Playwright.

Shared by the browser tests and the benchmarks (tests/browser/, bench/); kept out of the installed `ui`
package, so it is imported from the repository root (`python -m bench.browser`, pytest). The JavaScript snippets
(``*_JS`` and the ``*_js`` functions) work with Playwright's sync and async APIs alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mha_core.views import images

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMIUM_ARGS = images.CHROMIUM, images.CHROMIUM_ARGS  # one place: what mc pictures with too

# True once the app is up and idle: connected, a script run has finished and none runs now (Streamlit's own marks
# on its root, ``data-test-script-state``: "initial" until a first run; the 'Running...' widget is not shown), and
# the sidebar is drawn. The sidebar and no status widget alone hold before the first run starts (the page links are
# drawn by the browser, and nothing shows a run that has not begun): under load a test then clicked a page's skeleton.
APP_IDLE_JS = """
() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return !!app && app.dataset.testScriptState === 'notRunning' && app.dataset.testConnectionState === 'CONNECTED'
      && !!document.querySelector('[data-testid="stSidebar"]')
      && !document.querySelector('[data-testid="stStatusWidget"]');
}
"""

# The tokens of the head view (Explore's canvas head view, ui/headview/) once it is drawn, or null.
HEAD_VIEW_TOKENS_JS = """
() => {
  const root = document.querySelector('.hs-headview');
  if (!root || !root.dataset.sig || !(root.dataset.drawn || '').startsWith(root.dataset.sig + ':')) return null;
  return JSON.parse(root.dataset.tokens);
}
"""

# What went wrong on the page, as short strings: exceptions, st.error boxes, a traceback in the text.
PAGE_PROBLEMS_JS = """
() => {
  const problems = [];
  document.querySelectorAll('[data-testid="stException"]').forEach(e =>
      problems.push('exception: ' + e.innerText.slice(0, 200)));
  document.querySelectorAll('[data-testid="stAlertContentError"]').forEach(e =>
      problems.push('error: ' + e.innerText.slice(0, 200)));
  if (document.body && document.body.innerText.includes('Traceback')) problems.push('traceback in the page text');
  return problems;
}
"""

# Every input widget of the app as the browser shows it: [label, value] pairs in page order (the sidebar's
# first). A value is what the visitor sees: a slider's value text, a selectbox's shown option, a radio's or a
# segmented control's chosen option, a number or text box's content, a toggle's "on" / "off", a multiselect's
# chosen options joined by ", ". Widgets in a collapsed expander are read too (they are in the DOM).
WIDGET_VALUES_JS = """
() => {
  const label = (w) => {
    const node = w.querySelector('[data-testid="stWidgetLabel"]');
    return node ? node.textContent.trim() : '';
  };
  const read = {
    stSlider: (w) => Array.from(w.querySelectorAll('input[type="range"]')).map(i => i.getAttribute('aria-valuetext')).join(', '),
    stSelectbox: (w) => (w.querySelector('input[role="combobox"]') || {}).value,
    stRadio: (w) => {
      const checked = w.querySelector('input[type="radio"]:checked');
      return checked ? checked.closest('[data-testid="stRadioOption"]').textContent.trim() : null;
    },
    stNumberInput: (w) => w.querySelector('input').value,
    stTextInput: (w) => w.querySelector('input').value,
    stCheckbox: (w) => (w.querySelector('input[type="checkbox"]').checked ? 'on' : 'off'),
    stMultiSelect: (w) => Array.from(w.querySelectorAll('[data-tag] [title]')).map(t => t.getAttribute('title')).join(', '),
    stButtonGroup: (w) => Array.from(w.querySelectorAll('button[aria-checked="true"]')).map(b => b.textContent.trim()).join(', '),
  };
  const selector = Object.keys(read).map(id => `[data-testid="${id}"]`).join(', ');
  return Array.from(document.querySelectorAll(selector)).map(w => [label(w), read[w.dataset.testid](w)]);
}
"""

# The page's title (its h1), its warnings and what went wrong on it, for checking a page opened from a link.
PAGE_STATE_JS = (
    """
() => ({
  title: (document.querySelector('[data-testid="stMain"] h1') || {}).textContent || null,
  warnings: Array.from(document.querySelectorAll('[data-testid="stAlertContentWarning"]')).map(w => w.innerText),
  idle: ("""
    + APP_IDLE_JS.strip()
    + """)(),
  problems: ("""
    + PAGE_PROBLEMS_JS.strip()
    + """)(),
})
"""
)

SENTENCE_LABEL = "Sentence"  # the sidebar's sentence box (ui/widgets/sidebar.py)

# Every WebSocket the page opens is kept in window.__sockets; while window.__blockSockets is true a new one
# goes to a closed port (the server is unreachable), so the page keeps trying until it is let through.
SOCKETS_JS = """
(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.__blockSockets = false;
  window.WebSocket = function (url, protocols) {
    const target = window.__blockSockets ? url.replace(/:\\d+\\//, ':9/') : url;
    const socket = protocols === undefined ? new Native(target) : new Native(target, protocols);
    window.__sockets.push(socket);
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
})();
"""
# Every binary message the page's WebSockets receive (Streamlit's ForwardMsg protobufs), base64, in the order the
# page handled them, kept in window.__frames: read and cleared in the page, so a reading holds exactly what the
# page had received by then (Playwright's own frame events reach Python later, by an amount load decides).
FRAMES_JS = """
(() => {
  const Native = window.WebSocket;
  window.__frames = [];
  window.WebSocket = function (url, protocols) {
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    socket.addEventListener('message', (event) => {
      if (!(event.data instanceof ArrayBuffer)) return;
      const bytes = new Uint8Array(event.data);
      let text = '';
      for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
      window.__frames.push(btoa(text));
    });
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
})();
"""
TAKE_FRAMES_JS = "() => { const frames = window.__frames; window.__frames = []; return frames; }"
DROP_CONNECTION_JS = "() => { window.__blockSockets = true; window.__sockets.forEach(s => s.close()); }"
RECONNECTED_JS = "() => window.__sockets.length > 0 && window.__sockets[window.__sockets.length - 1].readyState === 1"
# How many scored steps the Lab's loss curve shows (tests/browser/test_browser.py).
LAB_POINTS_JS = """
() => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout.title || {}).text || '').startsWith('Loss'));
  return gd && gd._fullData[0] ? gd._fullData[0].x.length : 0;
}
"""
# How many shards of a corpus profile its progress bar says are done (hidden or not), or -1 without one:
# "shard k of n: ..." while shard k is computed, "d of n shards done" / "d of n shards from the cache".
PROFILE_SHARDS_JS = """
() => {
  const text = Array.from(document.querySelectorAll('[data-testid="stProgress"]')).map(e => e.textContent).join(' ');
  const computing = text.match(/shard (\\d+) of \\d+/);
  if (computing) return Number(computing[1]) - 1;
  const done = text.match(/(\\d+) of \\d+ shards/);
  return done ? Number(done[1]) : -1;
}
"""
# How many heads the Ablate page's head importance has ablated, from its progress text ("ablating head k of n"),
# or -1 without one.
IMPORTANCE_HEADS_JS = """
() => {
  const text = Array.from(document.querySelectorAll('[data-testid="stProgress"]')).map(e => e.textContent).join(' ');
  const done = text.match(/ablating head (\\d+) of \\d+/);
  return done ? Number(done[1]) : -1;
}
"""
# An idle server uses about 0.01 CPU-second a second whatever the machine's load (a process that waits uses no
# CPU); work that runs on uses 0.5-1 on a quiet machine and less on a busy one (0.2 beside three busy
# processes). Tests read idleness (below this), never a busy rate, which load changes.
IDLE_CPU_PER_S = 0.08


def cpu_seconds(process) -> float:
    """CPU-seconds used so far by ``process`` (a ``psutil.Process``)."""
    times = process.cpu_times()
    return times.user + times.system


def cpu_rate(process, seconds: float) -> float:
    """The server's CPU-seconds per second over the next ``seconds``."""
    before = cpu_seconds(process)
    time.sleep(seconds)
    return (cpu_seconds(process) - before) / seconds


def start_lab_training(page, url: str) -> None:
    """The Lab page, 3000 steps (the slider's last value), Start; returns once the curve has points."""
    page.goto(f"{url}/?page=lab")
    wait_for_app(page)
    page.get_by_role("slider").first.focus()
    page.keyboard.press("End")
    page.get_by_text("3000", exact=True).first.wait_for()
    wait_for_app(page)
    page.get_by_role("button", name="Start").click()
    page.wait_for_function(f"() => ({LAB_POINTS_JS})() >= 2")


def click_in_expander(page, expander: str, button: str, timeout_ms: int | None = None) -> None:
    """Click the button named ``button`` in the expander whose label holds ``expander``, opening the expander first,
    and again if a rerun closed it before the click landed (bounded by ``timeout_ms``, default
    ``DEFAULT_TIMEOUT_MS``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    # The expander by its own label (another expander's text may name it: a glossary of the page's sections).
    details = page.locator("details").filter(has=page.locator("summary", has_text=expander)).first
    deadline = time.monotonic() + (timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
    while True:
        if not details.evaluate("(element) => element.open"):
            details.locator("summary").click()
        try:
            details.get_by_role("button", name=button).click(timeout=5_000)
            return
        except PlaywrightTimeoutError:
            if time.monotonic() > deadline:
                raise


def start_importance(page, url: str) -> None:
    """The Ablate page's head importance (20 UD sentences, MiniLM: 72 heads ablated one by one), started; returns
    once its progress says a head is being ablated (in the page, shown or in an expander a rerun closed)."""
    page.goto(f"{url}/?page=ablate")
    wait_for_app(page)
    click_in_expander(page, "Importance ranking", "Compute")
    # Bounded by what it waits for, not by a time load changes: the pass before the first head, on a busy machine.
    page.get_by_text("ablating head", exact=False).first.wait_for(state="attached", timeout=DEFAULT_TIMEOUT_MS)


def start_profile(page, url: str, sentences: int) -> None:
    """The Roles page's corpus profile of ``sentences`` UD sentences, started."""
    page.goto(f"{url}/?page=roles")
    wait_for_app(page)
    page.get_by_text("coloured by role", exact=False).first.wait_for()
    page.locator("summary").filter(has_text="Corpus profile").click()
    box = (
        page.locator("details").filter(has=page.locator("summary", has_text="Corpus profile")).get_by_label("Sentences")
    )
    box.fill(str(sentences))
    box.press("Tab")
    wait_for_app(page)
    click_in_expander(page, "Corpus profile", "Profile heads")


def wait_until_idle(process, bound_s: float, window_s: float = 1.0, windows: int = 1) -> float | None:
    """Seconds until ``process`` (a ``psutil.Process``: a server) uses less than ``IDLE_CPU_PER_S`` over ``windows``
    windows of ``window_s`` in a row (the end of the last), or None if it is not after ``bound_s``. On a machine
    loaded far past its cores a server that still works can be left without a core for a whole window (seen at a
    load average of 14: idle 1.1 s after its page closed, within the 3 s the work goes on): a test asks for
    several windows in a row."""
    start, idle = time.monotonic(), 0
    while time.monotonic() - start < bound_s:
        idle = idle + 1 if cpu_rate(process, window_s) < IDLE_CPU_PER_S else 0
        if idle >= windows:
            return time.monotonic() - start
    return None


# Playwright's bound on an action or a wait that names none (its own default: 30 s), and the tests' bound on a page
# showing what it must. A bound, not a speed claim: a page that draws in a second on a quiet machine took up to two
# minutes with three busy processes beside the suite and other work on the machine's two cores (load average 17).
DEFAULT_TIMEOUT_MS = 300_000


def chromium_available() -> bool:
    return Path(CHROMIUM).exists()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class StreamlitServer:
    """A running ``streamlit run serve.py``: ``url`` is always on loopback, whatever address it is bound to."""

    url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def dump_stacks(self) -> None:
        """What the server was doing when a test failed: every thread's stack, written at the end of its log by
        faulthandler (``PYTHONFAULTHANDLER``) on SIGABRT, which then ends the server."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        print(f"The server's log (its threads' stacks at the end): {self.log_path}", file=sys.stderr)


@contextlib.contextmanager
def start_streamlit(
    *,
    env: Mapping[str, str | None] | None = None,
    address: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    startup_timeout: float = 120.0,
    root: Path = ROOT,
    script: str | None = None,
) -> Iterator[StreamlitServer]:
    """``streamlit run serve.py`` (app.py with its HTTP side: ``ui.server``, and in a class the teacher key out of
    the address and the class's HttpOnly cookies, as ``scripts/app.sh`` serves it) on a free port, bound to
    ``address``; yields it once healthy; stops it after. ``script``: another script (``app.py`` alone).

    ``env`` is laid over this process's environment (a value of None removes the variable);
    ``extra_args`` go after the server options (e.g. ``--server.fileWatcherType none``); ``root`` is
    the checkout whose ``app.py`` runs (another checkout of Headscope, e.g. an earlier commit, for a
    before/after benchmark; give it ``PYTHONPATH`` in ``env`` so its own packages are imported).
    """
    port = free_port()
    log_path = ROOT / "test-artifacts" / f"streamlit-{port}.log"
    log_path.parent.mkdir(exist_ok=True)
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = str(value)
    environment.setdefault("PYTHONFAULTHANDLER", "1")  # a failure's server log ends with its threads' stacks
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                script or ("serve.py" if (root / "serve.py").is_file() else "app.py"),  # an earlier checkout: app.py
                "--server.port",
                str(port),
                "--server.address",
                address,
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
                *extra_args,
            ],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not start; see {log_path}")
                time.sleep(0.5)
            server = StreamlitServer(url=url, process=process, log_path=log_path)
            yield server
        except Exception:
            server.dump_stacks()
            raise
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)


@contextlib.contextmanager
def streamlit_server(startup_timeout: float = 120.0):
    """``streamlit run serve.py`` on a free loopback port; yields the base URL; stops the server after."""
    with start_streamlit(startup_timeout=startup_timeout) as server:
        yield server.url


chromium_launch_options = images.chromium_launch_options


@contextlib.contextmanager
def chromium_page(width: int = 1500, height: int = 1100):
    from playwright.sync_api import sync_playwright  # playwright: only the browser tests and bench use it

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            yield new_page(browser, width, height)
        except Exception:
            save_pages(browser)
            raise
        finally:
            browser.close()


def new_page(browser, width: int = 1500, height: int = 1100):
    """A page in a browser context of its own (its own cookies: another session of the app), whose actions and
    waits that name no bound are bounded by ``DEFAULT_TIMEOUT_MS``, not Playwright's 30 s, which a busy machine
    exceeds (a page's first load took 50-100 s beside three busy processes at a load average of 9-14)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    return context.new_page()


def save_pages(browser) -> list[Path]:
    """What each open page of ``browser`` shows, saved in test-artifacts/ when a test fails: a screenshot of the
    whole page and its text, named after the test (``PYTEST_CURRENT_TEST``). Best effort: a page that cannot be
    read (crashed, closing) is left out; the test's own error is what is reported."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "browser").split(" ")[0]
    stem = "failure-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in test.split("/")[-1])[:120]
    folder = ROOT / "test-artifacts"
    folder.mkdir(exist_ok=True)
    saved = []
    pages = [page for context in browser.contexts for page in context.pages if not page.is_closed()]
    for number, page in enumerate(pages):
        path = folder / f"{stem}-{number}.png"
        try:
            page.screenshot(path=str(path), full_page=True, timeout=60_000)
            path.with_suffix(".txt").write_text(f"{page.url}\n\n{page.inner_text('body', timeout=30_000)}")
        except Exception as error:  # the test's own failure is what matters, not this one
            print(f"Page {number} ({page.url}) could not be saved: {error}", file=sys.stderr)
            continue
        saved.append(path)
        print(f"What page {number} showed when the test failed: {path} (its text beside it, .txt)", file=sys.stderr)
    return saved


def wait_for_app(page, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
    """Until a script run has finished and none runs (``APP_IDLE_JS``), the sidebar up."""
    page.wait_for_function(APP_IDLE_JS, timeout=timeout_ms)


def wait_for_address(page, *parts: str, timeout_ms: int = 60_000) -> str:
    """Until the page's address holds every one of ``parts`` (e.g. ``"gen=1"``), and return it. The address is written
    by the run that follows a click, which a loaded machine may finish after the click's drawing shows; on timeout,
    an ``AssertionError`` naming the parts missing from the address it holds then."""
    check = "(parts) => parts.every((part) => window.location.href.includes(part))"
    try:
        page.wait_for_function(check, arg=list(parts), timeout=timeout_ms)
    except Exception as error:
        missing = [part for part in parts if part not in page.url]
        raise AssertionError(f"the address {page.url} lacks {missing} after {timeout_ms} ms") from error
    return page.url


def head_view_js(num_heads: int, token: str, layer: int | None = None) -> str:
    """A JS predicate: Explore's head view (ui/headview/headview.js) is drawn with ``token``:
    the sentence holding ``token`` is the one painted (``data-drawn`` is set after every canvas of the
    view is painted, and names the sentence's data), every one of the ``num_heads`` heads is labelled
    with the painted layer (``layer`` if given), and the enlarged head, when shown, labels its rows and
    columns with the sentence's tokens (up to 96 tokens; beyond, its labels are left out; a cross view's
    columns with the source's tokens)."""
    wanted = "null" if layer is None else str(int(layer))
    return f"""
() => {{
  const root = document.querySelector('.hs-headview');
  if (!root || !root.dataset.sig || !root.dataset.drawn) return false;
  const [sig, layer, head] = root.dataset.drawn.split(':');
  if (sig !== root.dataset.sig || ({wanted} !== null && layer !== String({wanted}))) return false;
  const tokens = JSON.parse(root.dataset.tokens);
  if (!tokens.includes({json.dumps(token)})) return false;
  const labels = Array.from(root.querySelectorAll('.hs-tile .hs-label')).map(l => l.textContent);
  if (labels.length !== {num_heads} || !labels.every((text, h) => text === `L${{layer}} H${{h}}`)) return false;
  if (root.querySelectorAll('.hs-tile canvas').length !== {num_heads}) return false;
  const big = root.querySelector('.hs-big');
  if (!big || big.style.display === 'none') return Number(root.dataset.painted) === {num_heads};
  if (Number(root.dataset.painted) !== {num_heads} + 1) return false;
  if (root.querySelector('.hs-big-title').textContent !== `Layer ${{layer}}, head ${{head}}`) return false;
  if (tokens.length > 96) return true;
  const rows = Array.from(big.querySelectorAll('.hs-row-label')).map(l => l.textContent);
  const cols = Array.from(big.querySelectorAll('.hs-col-label')).map(l => l.textContent);
  const keys = JSON.parse(root.dataset.keyTokens || root.dataset.tokens);  // the source's, in a cross view
  return rows.length === tokens.length && rows.every((t, i) => t === tokens[i])
      && cols.length === keys.length && cols.every((t, i) => t === keys[i]);
}}
"""


def model_view_js(num_layers: int, num_heads: int, token: str) -> str:
    """A JS predicate: Explore's model view (ui/headview/) is drawn with ``token``: the sentence holding
    ``token`` is the one painted (``data-drawn`` is "<sig>:model" once every tile is painted), each of the
    ``num_layers`` x ``num_heads`` tiles is an n x n canvas, and every layer and head is labelled."""
    return f"""
() => {{
  const root = document.querySelector('.hs-headview');
  if (!root || !root.dataset.sig || root.dataset.drawn !== root.dataset.sig + ':model') return false;
  const tokens = JSON.parse(root.dataset.tokens);
  if (!tokens.includes({json.dumps(token)})) return false;
  const tiles = Array.from(root.querySelectorAll('.hs-model-canvas'));
  if (tiles.length !== {num_layers * num_heads} || Number(root.dataset.painted) !== tiles.length) return false;
  if (!tiles.every(c => c.width === tokens.length && c.height === tokens.length)) return false;
  const labels = Array.from(root.querySelectorAll('.hs-model-row, .hs-model-col')).map(l => l.textContent);
  return labels.filter(t => /^head \\d+$/.test(t)).length === {num_heads}
      && labels.filter(t => /^(layer |L)\\d+$/.test(t)).length === {num_layers};
}}
"""


def type_sentence(page, text: str) -> float:
    """Type ``text`` into the sidebar's sentence box and press Enter; returns the time Enter was pressed."""
    box = page.get_by_label(SENTENCE_LABEL, exact=True)
    box.fill(text)
    start = time.perf_counter()
    box.press("Enter")
    return start
