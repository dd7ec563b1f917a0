"""The files of the views drawn in the browser, and the one list of which files each view needs.

The scripts and styles live in ``assets/`` beside this module (``viewkit/``: the kit every view shares; ``headview/``:
the head, model and cross-attention view; ``longview/``: the long document's deep zoom; ``tableview/``: a
head table as a layer x head grid). ``VIEW_FILES`` names, for
each view, its files in order; the app's Streamlit components (``ui.viewkit.component``), the standalone files and
the notebook widgets (``mha_core.views.standalone``) all read the view's script and style through ``script`` and
``style`` here, so a file added to a view's list is in every one of them.

A view's files are ES modules that import each other by relative lines (``import { a, b } from
"../viewkit/viewkit.js";``), which node's test runner resolves (``tests/js/``). A view is sent as ONE module:
Streamlit loads a component's inline script from a ``blob:`` address (a relative ``import`` cannot resolve there) and
a saved file must fetch nothing. So ``script`` puts the list's scripts one after another, each library script's
declarations without ``export`` (it exports them one by one: ``export function`` / ``export const``), the import
lines between them taken out; the last script of the list is the view's own, whose default export mounts it.
"""

from __future__ import annotations

import re
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"

# Each view's files, in order: the scripts a later script imports come before it; the view's own script last.
VIEW_FILES = {
    "headview": ("viewkit/viewkit.js", "viewkit/viewkit.css", "headview/headview.js", "headview/headview.css"),
    "longview": ("viewkit/viewkit.js", "viewkit/viewkit.css", "longview/longview.js", "longview/longview.css"),
    "tableview": ("viewkit/viewkit.js", "viewkit/viewkit.css", "tableview/tableview.js", "tableview/tableview.css"),
}

# One import line between the kit's files (names only, no renaming), its folder and file.
IMPORT_LINE = re.compile(r'^import \{[\w\s,]*\} from "\.\./(?P<file>[\w-]+/[\w.-]+\.js)";[ \t]*\n', flags=re.MULTILINE)


def files(view: str, suffix: str) -> list[Path]:
    """The view's files ending in ``suffix`` (".js" or ".css"), in the list's order."""
    if view not in VIEW_FILES:
        raise ValueError(f"there is no view {view!r}: the views are {', '.join(sorted(VIEW_FILES))}")
    return [ASSETS / name for name in VIEW_FILES[view] if name.endswith(suffix)]


def library_text(path: Path) -> str:
    """A script another one imports, as it goes into the view's one module: its declarations without ``export``."""
    text = path.read_text(encoding="utf-8")
    if re.search(r"^export (default|\{)", text, flags=re.MULTILINE):
        raise RuntimeError(f"{path.name} exports its declarations one by one (export function / const), nothing else")
    return re.sub(r"^export ", "", text, flags=re.MULTILINE)


def script(view: str) -> str:
    """The view's scripts as one ES module (the view's own last, with its default export), nothing imported."""
    paths = files(view, ".js")
    names = [path.relative_to(ASSETS).as_posix() for path in paths]
    parts = []
    for index, path in enumerate(paths):
        text = path.read_text(encoding="utf-8") if index == len(paths) - 1 else library_text(path)
        for found in IMPORT_LINE.finditer(text):
            if found["file"] not in names[:index]:
                raise RuntimeError(
                    f"{names[index]} imports {found['file']}, which is not before it in the view's files (VIEW_FILES)"
                )
        rest = IMPORT_LINE.sub("", text)
        if re.search(r"^import\b", rest, flags=re.MULTILINE):
            raise RuntimeError(f'{names[index]} imports by a line other than import {{ ... }} from "../dir/file.js"')
        parts.append(f"// ---- {names[index]}\n{rest}")
    return "\n".join(parts)


def style(view: str) -> str:
    """The view's style sheets, in the list's order (the kit's first)."""
    return "\n".join(path.read_text(encoding="utf-8") for path in files(view, ".css"))
