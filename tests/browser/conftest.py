"""When a browser test fails while a server of ``tools.browser.start_streamlit`` given to it by a fixture still runs,
the server's log gets every thread's stack (``StreamlitServer.dump_stacks``): what it was doing, or waiting for.
A server the test starts itself does this on its own; the pages' screenshots come from ``chromium_page``."""

from __future__ import annotations

import pytest

from tools.browser import StreamlitServer


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, StreamlitServer):
                value.dump_stacks()
    return report
