"""AppTest helpers: open the app on a page with widget settings, and read its figures as the browser gets them.

Figures: the JSON in a Plotly element's ``proto.spec``, typed arrays decoded.

Plotly 7 sends numpy arrays as base64 typed arrays, ``{"dtype": "f8", "bdata": "...", "shape": "4, 4"}``;
``decode`` turns every such dict back into a numpy array so tests can compare values.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

APP_SCRIPT = Path(__file__).with_name("app_script.py")


def decode(value):
    """``value`` with every typed-array dict replaced by a numpy array (recursively)."""
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            shape = value.get("shape")
            if shape:
                array = array.reshape([int(s) for s in str(shape).split(",")])
            return array
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def figure_spec(element) -> dict:
    """The decoded figure (``data`` and ``layout``) of an AppTest plotly element."""
    return decode(json.loads(element.proto.spec))


def plotly_elements(app) -> dict:
    """Every plotly chart of an AppTest run, by its widget key (the ``key=`` passed to ``st.plotly_chart``)."""
    return {element.key: figure_spec(element) for element in app.get("plotly_chart")}


def widget(app, key: str):
    """The input widget of an AppTest run with this ``key=``, whatever its kind."""
    for kind in ("radio", "slider", "select_slider", "number_input", "toggle", "selectbox", "multiselect"):
        for element in app.get(kind):
            if element.key == key:
                return element
    raise KeyError(f"no widget with key {key!r}")


def open_app(page: str | None = None, query: dict | None = None, timeout: float = 300) -> AppTest:
    """app.py under AppTest, on ``page`` (its url path: "roles", "compare", ...), with ``query`` in the URL."""
    app = AppTest.from_file(str(APP_SCRIPT), default_timeout=timeout)
    app.query_params.update({**({"page": page} if page else {}), **(query or {})})
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def rerun(app: AppTest) -> AppTest:
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def run_page(page: str, query_params: dict | None = None, **widgets) -> AppTest:
    """Open the app on ``page``, then set each widget (by key, in the order given), rerunning after each."""
    app = open_app(page, query_params)
    for key, value in widgets.items():
        widget(app, key).set_value(value)
        rerun(app)
    return app


def head_view_data(app, key: str = "head_view") -> dict:
    """The data of Explore's canvas head view (``ui.headview``) as the browser gets it (``proto.json``), with
    ``weights_by_layer`` (``{layer: [heads, n, n]}``, decoded) and ``enlarged`` (the selected head's n x n)."""
    from ui import headview

    elements = [
        e
        for e in app.get("bidi_component")
        if e.proto.component_name == "headscope_head_view" and e.proto.id.endswith(f"-{key}")
    ]
    assert len(elements) == 1, f"{len(elements)} head views keyed {key!r}"
    data = json.loads(elements[0].proto.json)
    data["weights_by_layer"] = headview.unpack(data)
    data["enlarged_head"] = data["weights_by_layer"][data["layer"]][data["head"]]
    return data


def train_to_the_end(runner, limit_s: float = 600.0) -> None:
    """Wait (bounded) for a Lab page's training thread (``ui.lab_runner.LabRunner``) to stop, renewing its session's
    heartbeat meanwhile as the open page's poll does every second. AppTest draws the page once and does not poll:
    without the beat, a training that outlasts the 3 s grace (any training, on a busy machine) waits for a page
    that never comes back, then ends as a closed tab's does."""
    deadline = time.monotonic() + limit_s
    while runner.running and time.monotonic() < deadline:
        runner.touch()
        runner.join(timeout=0.5)


def trained(app):
    """A Lab page's training started with its button and waited for to the end (``train_to_the_end``), the page drawn
    again after it: the page's runner, whose status is then "done"."""
    app.button(key="lab_start").click()
    rerun(app)
    runner = app.session_state["lab_runner"]
    train_to_the_end(runner)
    assert runner.status == "done", runner.status
    rerun(app)
    return runner


def deferred_downloads(monkeypatch):
    """What a download button built only when clicked (``st.download_button(data=callable)``) gives: call before the
    AppTest runs; ``fetch(button)`` then calls the button's callable as a click does and returns the file's bytes."""
    from streamlit.testing.v1 import app_test  # AppTest makes a file manager a run; a click asks it for the file

    made, manager_class = [], app_test.MediaFileManager

    def manager(storage):
        made.append((manager_class(storage), storage))
        return made[-1][0]

    monkeypatch.setattr(app_test, "MediaFileManager", manager)

    def fetch(button) -> bytes:
        files, storage = made[-1]
        url = files.execute_deferred(button.proto.deferred_file_id)
        return storage.get_file(url.rsplit("/", 1)[-1].split(".", 1)[0]).content

    return fetch
