"""The views outside the app: one self-contained HTML file, and the same view live in a notebook.

``view_of`` packs what a view draws from a run (an ``AttentionRun``: the head view, or the model view; an
encoder-decoder's ``CrossAttentionRun`` / ``Seq2SeqRun``: the cross-attention view; a ``LongRun``: the deep zoom)
with the same packers the app's components use (``heads.pack``, ``long.pack_layer`` / ``pack_model``). ``html``
writes it as ONE file: the view's scripts and styles (``assets.VIEW_FILES``, the app's very files) and the data inside,
nothing fetched when it is opened, so it works offline and from a mail attachment; clicks on heads, the layer
slider and the head/model switch redraw in the page. ``show`` draws the same script in Jupyter as an anywidget
(an optional dependency) with no server: the long view's zoom asks the notebook's kernel for the region, as it asks
the app's server; where widgets are off, the notebook shows the static file instead (``text/html`` beside the
widget). Tokens are user text: the scripts set them only as ``textContent``; the data goes into the page as JSON
with ``<``, ``>`` and ``&`` escaped, so no token can end its script element.
"""

from __future__ import annotations

import html as html_text
import json
import re
from dataclasses import dataclass
from pathlib import Path

from mha_core.views import assets, heads, long, tables

# Each view's root element (the class its script mounts on).
ROOT_CLASS = {"headview": "hs-headview", "longview": "hs-longview", "tableview": "hs-tableview"}
# What a file or a notebook leaves out: the head view's "Lines" shape is a chart the app's page draws below it.
STANDALONE_CSS = (
    ".hs-standalone { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; color: #212529; }\n"
    ".hs-standalone .hs-shapes { display: none; }\n"
)
# Every layer of a sentence goes into a file (the app sends one layer past ``heads.ALL_LAYERS_MAX_CELLS``).
FILE_MAX_CELLS = 1 << 62
ANYWIDGET_HINT = "pip install anywidget==0.11.0 (or write the view to a file: mc.save_html(run, path))"


@dataclass(frozen=True)
class View:
    """One view ready to draw: which script (``view``: a key of ``assets.VIEW_FILES``), its data, a title; and for
    the long view the run it was packed from (a notebook's zoom asks it for the region)."""

    view: str
    data: dict
    title: str
    source: object = None
    lang: str = "en"  # the page's <html lang>: the language of the view's words (``strings``)

    def to_html(self) -> str:
        return page(self)

    def save(self, path) -> Path:
        return save_html(self, path)

    def _repr_html_(self) -> str:
        return framed(self)


TITLE_TEXT_CHARS = 80  # a title's share of the run's text


RUN_TITLE = "{model}:{quoted} ({count} tokens)"  # a run's page title (``strings`` may hold it in another language)


def _run_title(run, strings: dict | None = None) -> str:
    """``model: "text" (n tokens)``, the text cut to ``TITLE_TEXT_CHARS`` (escaped where it is shown), in the
    language of ``strings`` (none: English)."""
    text = " ".join(str(getattr(run, "text", "") or "").split())
    text = text if len(text) <= TITLE_TEXT_CHARS else text[: TITLE_TEXT_CHARS - 1] + "…"
    quoted = f' "{text}"' if text else ""
    model = getattr(run, "model_name", "") or "attention"
    return tables.worded(strings, RUN_TITLE, model=model, quoted=quoted, count=f"{len(run.tokens):,}")


def check_head(run, layer: int, head: int) -> None:
    """A clear error for a layer or head the run does not have."""
    if not (0 <= layer < run.num_layers and 0 <= head < run.num_heads):
        raise ValueError(
            f"there is no head ({layer}, {head}) in this run: layers 0 to {run.num_layers - 1}, "
            f"heads 0 to {run.num_heads - 1}"
        )


def view_of(
    obj,
    *,
    layer: int = 0,
    head: int = 0,
    view: str = "head",
    kind: str = "cross",
    column: str | None = None,
    strings: dict | None = None,
    lang: str = "en",
) -> View:
    """The view of ``obj``: an ``AttentionRun`` (``view`` "head" or "model"), a ``CrossAttentionRun``, a
    ``Seq2SeqRun`` (its ``kind``: "encoder", "decoder" or "cross"), a ``LongRun`` (the deep zoom of ``layer``,
    ``head``; ``view="model"``: every head at overview level), a head table (a DataFrame with ``layer`` and ``head``
    columns: a layer x head grid coloured by ``column``, the first numeric one by default; the Circuits maps'
    copying, previous-token, attribution and patching scores), a table of pairs of heads (``mc.composition``: the
    receivers' grid, ``tables.composition_heads``), or a ``View`` (as it is). A head table's view and the head view
    speak English; ``strings`` gives their own words in another language (English -> translation: a head table's
    ``tables.VIEW_TEXTS``, the head view's the words its script translates) and ``lang`` that language's tag, the
    page's ``<html lang>`` ("zh-CN")."""
    if isinstance(obj, View):
        return obj
    if tables.is_pair_table(obj):  # a composition table: each receiver head's senders
        data = tables.pack_table(tables.composition_heads(obj, column), column, layer, head, strings=strings)
        title = tables.worded(strings, tables.PAIRS_TITLE, count=f"{len(obj):,}", column=data["column"])
        return View("tableview", data, title, lang=lang)
    if hasattr(obj, "columns") and {"layer", "head"} <= set(obj.columns):  # a head table (pandas)
        data = tables.pack_table(obj, column, layer=layer, head=head, strings=strings)
        size = {"layers": data["num_layers"], "heads": data["num_heads"]}
        title = tables.worded(strings, tables.TABLE_TITLE, **size, rows=f"{len(obj):,}")
        return View("tableview", data, title, lang=lang)
    if hasattr(obj, "cross") and hasattr(obj, "kind"):  # an encoder-decoder's three attentions: one of them
        return view_of(obj.kind(kind), layer=layer, head=head, view=view, strings=strings, lang=lang)
    if view not in heads.VIEWS:
        raise ValueError(f"view must be one of {heads.VIEWS}, not {view!r}")
    if hasattr(obj, "attentions") or hasattr(obj, "overview_max"):
        check_head(obj, layer, head)
    if hasattr(obj, "overview_max"):  # a LongRun
        zoom = long.whole(layer, head, obj.num_tokens, view=view)
        data = long.pack_model(obj, zoom) if zoom.view == "model" else long.pack_layer(obj, zoom)
        return View("longview", data, f"{_run_title(obj)} (long document)", source=obj)
    if hasattr(obj, "attentions") and hasattr(obj, "tokens"):
        data = heads.pack(
            obj.attentions,
            obj.tokens,
            layer,
            head,
            causal=bool(obj.is_causal),
            segment_ids=getattr(obj, "segment_ids", None),
            max_cells=FILE_MAX_CELLS,
            view=view,
            switchable=getattr(obj, "key_tokens", None) is None,
            key_tokens=getattr(obj, "key_tokens", None),
        )
        if strings:  # the head view's words in another language (headview.js's ``tr``)
            data = {**data, "strings": dict(strings)}
        return View("headview", data, _run_title(obj, strings), lang=lang)
    raise TypeError(
        f"cannot draw a {type(obj).__name__}: mc.show and mc.save_html draw an AttentionRun, a Seq2SeqRun, a "
        "CrossAttentionRun, a LongRun, a head table (a DataFrame with layer and head columns) or a table of pairs "
        "of heads (mc.composition)"
    )


def mount_script(view: str) -> str:
    """The view's one module (``assets.script``) with its default export bound to ``mountView`` and no exports left,
    for a page or a widget to call: ``mountView({data, parentElement, setStateValue})``."""
    text = assets.script(view)
    text, found = re.subn(r"^export default function\b", "const mountView = function", text, flags=re.MULTILINE)
    if found != 1:
        raise RuntimeError(f"{view}'s script must have one `export default function`, found {found}")
    return re.sub(r"^export \{[^}]*\};[ \t]*$", "", text, flags=re.MULTILINE)


def json_in_script(data: dict) -> str:
    """``data`` as JSON that cannot end the ``<script>`` element it sits in (``<``, ``>``, ``&`` as escapes)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(view: View) -> str:
    """The view as one self-contained HTML page: its style, its data and its script inside, nothing fetched."""
    root = ROOT_CLASS[view.view]
    return f"""<!DOCTYPE html>
<html lang="{html_text.escape(view.lang, quote=True)}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'; img-src data: blob:">
<meta name="generator" content="Headscope">
<title>{html_text.escape(view.title)}</title>
<style>
{assets.style(view.view)}
{STANDALONE_CSS}body {{ margin: 16px; }}
</style>
</head>
<body>
<main class="hs-standalone" id="hs-host"><h1 style="font-size:1.1rem">{html_text.escape(view.title)}</h1>
<div class="{root}"></div></main>
<script type="application/json" id="hs-data">{json_in_script(view.data)}</script>
<script type="module">
{mount_script(view.view)}
mountView({{
  data: JSON.parse(document.getElementById("hs-data").textContent),
  parentElement: document.getElementById("hs-host"),
  setStateValue() {{}},  // a file has no server: every switch it can make is drawn here
}});
</script>
</body>
</html>
"""


def html(obj, **options) -> str:
    """The page of ``obj``'s view (``view_of``'s options: ``layer``, ``head``, ``view``, ``kind``)."""
    return page(view_of(obj, **options))


def save_html(obj, path, **options) -> Path:
    """Write ``obj``'s view (``view_of``) as one self-contained HTML file at ``path``; return the path."""
    path = Path(path)
    path.write_text(html(obj, **options), encoding="utf-8")
    return path


def to_html(obj, path=None, **options) -> str | Path:
    """A run's ``to_html``: the page's text, or with a ``path`` the file written there (its path)."""
    return html(obj, **options) if path is None else save_html(obj, path, **options)


def framed(view: View, height: int = 720) -> str:
    """The page in an ``<iframe srcdoc>``: a notebook's static output (its scripts run in the frame, not the
    notebook's page)."""
    return (
        f'<iframe srcdoc="{html_text.escape(page(view), quote=True)}" title="{html_text.escape(view.title)}" '
        f'style="width: 100%; height: {int(height)}px; border: 0"></iframe>'
    )


def widget_script(view: str) -> str:
    """The anywidget module of a view: the view's script, mounted in the widget's element with its data, redrawn
    when the kernel sends new data; what the view sends back (``pick``, ``zoom``) goes to the kernel."""
    root = ROOT_CLASS[view]
    return (
        mount_script(view)
        + f"""
export default {{
  render({{ model, el }}) {{
    el.classList.add("hs-standalone");
    const box = document.createElement("div");
    box.className = "{root}";
    el.appendChild(box);
    const mount = () => mountView({{
      data: model.get("data"),
      parentElement: el,
      setStateValue(name, value) {{
        model.set(name, value);
        model.save_changes();
      }},
    }});
    mount();
    model.on("change:data", mount);
    return () => model.off("change:data", mount);
  }},
}};
"""
    )


_WIDGETS = {}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def widget_class(view: str):
    """The anywidget class of a view (made once): ``data`` synced to the browser, ``pick`` and ``zoom`` back."""
    if view not in _WIDGETS:
        try:
            import anywidget  # anywidget: optional, only for notebooks
            import traitlets  # comes with anywidget (ipywidgets)
        except ImportError:
            raise ImportError(
                f"mc.show draws in a notebook with anywidget, which is not installed: {ANYWIDGET_HINT}"
            ) from None

        class HeadscopeView(anywidget.AnyWidget):
            _esm = widget_script(view)
            _css = assets.style(view) + STANDALONE_CSS
            data = traitlets.Dict().tag(sync=True)
            pick = traitlets.Dict().tag(sync=True)
            zoom = traitlets.Dict().tag(sync=True)

            def __init__(self, packed: View):
                super().__init__(data=packed.data)
                self.packed = packed
                self.observe(self._zoomed, names="zoom")

            def _zoomed(self, change) -> None:
                # The long view asks for a region, as it asks the app's server: pooled here from the run's blocks.
                run = self.packed.source
                zoom = long.parse_zoom(change["new"])
                if run is None or zoom is None:
                    return
                zoom, _ = long.checked(zoom, run.num_layers, run.num_heads, run.num_tokens)
                self.data = long.pack_model(run, zoom) if zoom.view == "model" else long.pack_layer(run, zoom)

            def _repr_mimebundle_(self, **kwargs):
                # The widget (as ipywidgets displays one), and the static page where widgets are off (a notebook
                # viewer, nbconvert): a frontend shows the richest of the two it can.
                return {
                    "text/plain": f"Headscope: {self.packed.title}",
                    "text/html": framed(self.packed),
                    WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.model_id},
                }

        HeadscopeView.__name__ = HeadscopeView.__qualname__ = f"HeadscopeView_{view}"
        _WIDGETS[view] = HeadscopeView
    return _WIDGETS[view]


def show(obj, **options):
    """Draw ``obj``'s view (``view_of``'s options) in a notebook, the app's interactive view with no server: a widget
    (anywidget), which also carries the static page for where widgets are off."""
    packed = view_of(obj, **options)
    return widget_class(packed.view)(packed)
