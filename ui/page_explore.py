"""The Explore page's settings (``ExploreSettings``, declared once: ``ui.page_settings``): the view (every head of
a layer, or the whole model), the enlarged head's shape, and the query token the lines focus on. The sentence,
the layer and head, and the word and special-token toggles are the app's shared ones (``ui.address``,
``ui.widgets.pickers``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mha_core.interventions.token_attribution import METHOD_LABELS, METHODS
from mha_core.models.generation import MAX_NEW_TOKENS
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION
from mha_core.models.seq2seq import DEFAULT_MAX_NEW_TOKENS
from ui import headview
from ui.page_settings import PageSettings, setting

ALL_TOKENS = -1  # the lines' focus on every query token (a selectbox shows None as no choice at all)
TEMPERATURES = (0.0, 0.2, 0.5, 0.7, 1.0, 1.5, 2.0)
TOP_KS = (0, 1, 5, 10, 50)  # 0: no top-k
TOP_PS = (1.0, 0.95, 0.9, 0.8, 0.5)  # 1.0: no top-p
NEEDLE_MIN_TOKENS = 256  # the shortest needle test
MAX_PROMPT_POSITION = 8192  # the prompt token picked on the head view (``ptok``): beyond any model's length here
KIND_LABELS = {  # an encoder-decoder model's three attentions
    "cross": "Cross-attention (target → source)",
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention",
}
DEFAULT_SOURCE = "The cat sat on the mat because it was tired."
DEFAULT_PAIR = "A dog sat on a mat."  # the second sentence a sentence encoder's similarity is explained with


@dataclass(frozen=True)
class ExploreSettings(PageSettings):
    """Every setting of the Explore page's head view. The focus's choices are the sentence's tokens."""

    view: str = setting("explore_view", "view", "choice", "head", options={v: v for v in headview.VIEWS})
    shape: str = setting("head_shape", "shape", "choice", "heatmap", options={s: s for s in headview.SHAPES})
    focus: int = setting("focus_token", "focus", "choice", ALL_TOKENS, label="Focus on query token")
    # "Why does this head look there?" (ui/widgets/decomposition.py): the query and the key follow the sentence
    # (the key starts as the one the head looks at most).
    decompose: bool = setting("decompose_on", "decompose", "flag", False, label="Split a score into its sources")
    score_query: int | None = setting("decompose_query", "score_query", "choice", label="Query (the token looking)")
    score_key: int | None = setting("decompose_key", "score_key", "choice", label="Key (the token looked at)")
    # The model writing (ui/widgets/predict.py): how many tokens it wrote (the +n buttons), how it draws them,
    # and the written token whose distribution is shown (one of the written tokens' positions).
    gen_count: int = setting("gen_count", "gen", "number", 0, minimum=0, maximum=MAX_NEW_TOKENS)
    temperature: float = setting(
        "gen_temperature",
        "temp",
        "choice",
        1.0,
        label="Temperature",
        help="0 takes the most likely token every time (greedy); higher spreads the choice.",
        options={t: str(t) for t in TEMPERATURES},
    )
    top_k: int = setting(
        "gen_top_k",
        "topk",
        "choice",
        0,
        label="Top-k",
        help="Draw only from the k most likely tokens.",
        options={k: "all" if k == 0 else str(k) for k in TOP_KS},
    )
    top_p: float = setting(
        "gen_top_p",
        "topp",
        "choice",
        1.0,
        label="Top-p",
        help="Draw only from the most likely tokens whose probabilities add up to p.",
        options={p: "off" if p >= 1.0 else str(p) for p in TOP_PS},
    )
    seed: int = setting(
        "gen_seed",
        "seed",
        "number",
        0,
        label="Seed",
        help="The same seed writes the same tokens.",
        minimum=0,
        maximum=2**31 - 1,
    )
    written: int | None = setting(
        "gen_token",
        "gtok",
        "choice",
        label="Written token",
        help="Each written token was drawn from the distribution below.",
    )
    # A prompt token picked on the head view (0: none): the model's prediction at the position before it.
    prompt_token: int = setting("gen_prompt_token", "ptok", "number", 0, minimum=0, maximum=MAX_PROMPT_POSITION)
    # The long document (ui/longdoc.py): an example, a pasted document or, with a decoder, a needle test (the
    # choices and the needle test's largest length follow the model).
    long_doc: str = setting("long_doc", "long", "choice", "0", label="Long document")
    needle: str = setting("long_needle", "needle", "sentence", NEEDLE, label="Needle")
    needle_question: str = setting(
        "long_question", "nq", "sentence", NEEDLE_QUESTION, label="Question (the model answers it)"
    )
    needle_tokens: int | None = setting(
        "long_needle_tokens", "nlen", "number", label="Tokens", minimum=NEEDLE_MIN_TOKENS
    )
    needle_depth: int = setting(
        "long_needle_depth",
        "ndepth",
        "number",
        50,
        label="Needle depth (% of the haystack before it)",
        minimum=0,
        maximum=100,
    )
    # An encoder-decoder model (ui/encoder_decoder.py): its source and target (or the model writes the target:
    # the default when it can) and which of its attentions. Its words and special-token toggles share the
    # address keys of the app's shared ones (``words``, ``hide``: ``ui.widgets.pickers``), declared there.
    source: str = setting("s2s_source", "source", "text", DEFAULT_SOURCE, label="Source text")
    write: bool | None = setting(
        "s2s_write",
        "write",
        "flag",
        label="Let the model write the target",
        help=f"Greedy decoding: the model's most likely next token each time, up to {DEFAULT_MAX_NEW_TOKENS} tokens.",
    )
    target: str = setting("s2s_target", "target", "text", "", label="Target text")
    kind: str = setting("s2s_kind", "kind", "choice", "cross", label="Attention", options=KIND_LABELS)
    # "What does the prediction depend on?" (ui/attribution_view.py): a decoder's next token to explain or a
    # sentence encoder's second sentence, the methods, and the method the heads are compared with (one of the
    # chosen reference methods).
    attr_on: bool = setting("attr_on", "attr", "flag", False, label="Score the tokens the prediction depends on")
    attr_target: str = setting(
        "attr_target",
        "atarget",
        "text",
        "",
        label="Next token to explain (empty: the model's own top prediction; mind the leading space)",
    )
    attr_pair: str = setting(
        "attr_pair",
        "apair",
        "text",
        DEFAULT_PAIR,
        label="Second sentence: the prediction explained is its similarity with the sidebar's sentence",
    )
    attr_methods: Sequence[str] = setting(
        "attr_methods",
        "amethods",
        "choices",
        list(METHODS),
        label="Methods",
        options={method: METHOD_LABELS[method] for method in METHODS},
    )
    attr_reference: str | None = setting("attr_reference", "aref", "choice", label="Heads compared with")


def focus_choices(tokens) -> dict[int, str]:
    """The lines' focus: every token, or one query token, as the selectbox shows them."""
    return {ALL_TOKENS: "all tokens", **{i: f"{i}: {token}" for i, token in enumerate(tokens)}}
