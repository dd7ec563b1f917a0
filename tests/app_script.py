"""app.py as AppTest must run it: the whole script on every run, as the server does.

AppTest treats a ``pages/`` folder beside its main script as Streamlit's older folder-based
navigation and, after the first run, runs the current page file by itself, without app.py (so
without the sidebar app.py draws). Started from this file, whose folder has no ``pages/``, every
run executes app.py, which registers the pages with ``st.navigation`` by their absolute paths;
``AppTest.switch_page("../pages/roles.py")`` and ``?page=roles`` open a page.
"""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "app.py"), run_name="__main__")
