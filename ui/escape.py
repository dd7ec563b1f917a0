"""Text from an address or a user made inert for any message: the one way such text reaches the screen (plain Python,
no Streamlit). ``ui.widgets.messages`` hands these to the pages; ``ui.compute`` uses them for its progress texts.

Streamlit renders messages, captions, alerts, widget labels and help, and progress texts as GitHub markdown with its
own additions (math between dollars, :material/icons:, :colour[text]) and links bare addresses: a value such as
``![a](http://host/beacon.png)`` would make every browser showing it fetch that address.
"""

from __future__ import annotations

import re

# Every ASCII punctuation character that starts markdown, HTML, an entity, Streamlit's math ($), its icons and
# colours (:material/x:, :red[x]) or an address it would link (http:, www.): a backslash shows each literally.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=&])")


def md_escape(text: str) -> str:
    """Text from an address or a user made inert for any message (st.markdown, st.caption, alerts, labels, help,
    progress text): markdown, HTML and Streamlit's own syntax shown literally. The one way such text reaches a
    message (``md_code`` for a code span)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", str(text))


def md_code(text: str) -> str:
    """Text from an address or a user as an inline code span, shown exactly as written (a code span renders no
    markdown, and a backslash in it is a backslash): delimited by a run of backticks longer than any inside, on
    one line."""
    text = " ".join(str(text).splitlines()) or " "
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"
