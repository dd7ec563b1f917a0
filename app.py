"""Headscope: look inside multi-head attention. ``streamlit run app.py``

The entry point: page setup, the shared sidebar (model, engine, sentence; all kept in the URL),
and navigation. A page is registered only if its file exists, so the app starts with any subset.
"""

from pathlib import Path

import streamlit as st

from mha_core.errors import quoted
from ui import address, follow, session, shell
from ui.i18n import t
from ui.settings import configure_process, settings
from ui.widgets import charts, messages, sidebar

ROOT = Path(__file__).resolve().parent
# A local icon file: a Material icon name would make the browser fetch it from fonts.gstatic.com. Once a run,
# before anything is drawn: a projector's page (presentation mode) starts with the sidebar folded (its arrow opens
# it); a second call in the run with another state would unfold it again on every rerun.
st.set_page_config(
    page_title="Headscope",
    page_icon=str(ROOT / "assets" / "favicon.png"),
    layout="wide",
    initial_sidebar_state="collapsed" if charts.presenting_at_start() else "expanded",
)

configure_process()

MODEL, ENGINE, SENTENCE = sidebar.MODEL, sidebar.ENGINE, sidebar.SENTENCE
# (file, title, icon, url path, the sidebar's inputs the page reads: only those are shown on it); the root address
# opens the first existing one.
PAGES = [
    ("pages/explore.py", "Explore", ":material/grid_view:", "explore", (MODEL, ENGINE, SENTENCE)),
    ("pages/compare.py", "Compare", ":material/compare:", "compare", (MODEL, ENGINE, SENTENCE)),
    ("pages/roles.py", "Head roles", ":material/badge:", "roles", (MODEL, ENGINE, SENTENCE)),
    ("pages/ablate.py", "Ablate", ":material/content_cut:", "ablate", (MODEL, ENGINE, SENTENCE)),
    ("pages/positions.py", "Positions", ":material/waves:", "positions", (MODEL,)),
    ("pages/classroom.py", "Classroom", ":material/school:", "classroom", ()),  # its own toy numbers
    ("pages/lab.py", "Lab", ":material/science:", "lab", ()),  # a model it trains
    ("pages/deeper.py", "Deeper", ":material/layers:", "deeper", (MODEL, ENGINE, SENTENCE)),
    ("pages/circuits.py", "Circuits", ":material/account_tree:", "circuits", (MODEL,)),  # its own prompts
    ("pages/heads.py", "Heads", ":material/style:", "heads", (MODEL, ENGINE)),  # cards over the UD dev sentences
]
PAGE_GUIDE = (
    "- **Explore**: every head of a layer, one head enlarged, the whole model at once.\n"
    "- **Compare**: two layers, two sentences, or two models / engines side by side.\n"
    "- **Head roles**: what each head does, measured against published tests.\n"
    "- **Ablate**: switch heads off and measure what the model loses; rank heads by importance.\n"
    "- **Positions**: sinusoidal positional encoding as waves and similarities.\n"
    "- **Classroom**: the worked example, step by step.\n"
    "- **Lab**: train a tiny transformer and watch its heads specialise.\n\n"
    "- **Deeper**: attention rollout and flow, weights against norms, the neuron view.\n\n"
    "- **Circuits** (decoders): what each head writes towards an answer, patching, the logit lens.\n\n"
    "- **Heads**: a card for every head over many sentences, searchable, each sentence one click from Explore.\n\n"
    "Everything you choose is in the page address: copy it to share this exact view."
)

# Pages whose own fragment draws the sidebar's sentence boxes, so that Enter reruns that fragment only.
SENTENCE_IN_PAGE = {"explore"}

available = [p for p in PAGES if (ROOT / p[0]).exists()]
# Every page has its own address (/compare?...), which a visitor can bookmark, share or reload. The root
# address is not a page: it opens the page ?page= names (links made before pages had addresses), else
# the first, at that page's own address, with the rest of the link.
# Titles in the session's language (``ui.i18n``: the sidebar's switch, ``lang=zh``); the addresses stay English.
pages = {
    path: st.Page(ROOT / file, title=t(title), icon=icon, url_path=path) for file, title, icon, path, _ in available
}
inputs = {path: reads for _, _, _, path, reads in available}
# Never run (app.py switches away from it first); a function page needs a url_path of its own.
root = st.Page(lambda: None, title="Headscope", url_path="start", default=True, visibility="hidden")
# The menu is drawn here as links: Streamlit's own menu would first list the pages/ folder for a moment
# (client.showSidebarNavigation = false hides that list, and with it any automatic menu).
navigation = st.navigation([root, *pages.values()], position="hidden")
if navigation is root:
    wanted_page = address.query_value("page")
    if wanted_page is not None and wanted_page not in pages:
        address.link_notice(
            t("there is no page {page}; showing {shown}.", page=quoted(wanted_page), shown=available[0][3])
        )
    link = {key: st.query_params.get_all(key) for key in st.query_params if key != "page"}
    st.switch_page(pages.get(wanted_page, pages[available[0][3]]), query_params=link)
follow.start(pages, navigation.url_path)  # a class: who leads; a follower moves to the teacher's view
with st.sidebar:
    for page in pages.values():
        st.page_link(page)
    st.divider()

with messages.error_display():
    sidebar.sidebar(
        sentence_in_page=navigation.url_path in SENTENCE_IN_PAGE, inputs=inputs.get(navigation.url_path, ())
    )
if not session.has_selection():  # the sidebar failed (its message is shown): nothing to show a page for
    st.stop()
if settings().classroom:
    sidebar.join_class_panel()
    follow.class_panel()
with st.sidebar.expander(t("About Headscope")):
    st.markdown(t(messages.INTRO) + "\n\n" + t(PAGE_GUIDE))

address.write_query(page=navigation.url_path)
messages.show_link_notices()
charts.presentation_styles()
sidebar.keep_alive()  # before the page: a page may end the run (st.stop)
with messages.error_display(), shell.page_in_app():
    navigation.run()
follow.publish()  # the teacher's view, for the class (also published by the panel's poll)
