"""Links to every page that set every setting of the page to a value other than its default.

A page opened from one of these links must show each value: in the session (tests/pages/test_links.py, AppTest) and
on the screen (tests/browser/test_browser_links.py, Chromium). Each setting names the widget (session key and label),
the value the link gives it (as the link writes it), what the app holds then, what the browser shows, and
its default with MiniLM and the default sentence (what a bad value in the link gives instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from mha_core.interventions.token_attribution import METHODS
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION
from ui.address import DEFAULT_TEXT
from ui.page_heads import CARD_SENTENCES
from ui.settings import PROFILE_SENTENCES


@dataclass(frozen=True)
class Setting:
    url_key: str
    link: str  # the value as the link writes it
    key: str  # the session key of its widget
    value: object  # the value the app holds
    label: str | None  # the widget's label on the page (None: drawn without a widget of its own)
    shown: str | None  # what the browser shows for it
    default: object  # its value when the link gives none (or a bad one)
    shown_after: str | None = None  # drawn only when this other setting (its address key) has the link's value


@dataclass(frozen=True)
class PageLink:
    name: str
    page: str  # the page's own address (url path)
    title: str
    settings: tuple[Setting, ...]
    query: dict[str, str] = field(default_factory=dict)  # the link's sidebar part (model, text, ...)
    shows: tuple[str, ...] = ()  # text the page shows from these settings (beyond its widgets)
    root: bool = False  # opened as /?page=..., as links made before pages had addresses

    @property
    def link_query(self) -> dict[str, str]:
        return {**self.query, **{s.url_key: s.link for s in self.settings}}

    def path(self, query: dict[str, str] | None = None) -> str:
        query = self.link_query if query is None else query
        if self.root:
            return "/?" + urlencode({"page": self.page, **query})
        return f"/{self.page}?" + urlencode(query)


MINILM = "all-MiniLM-L6-v2 (embedded encoder, 6 x 12 heads)"

LINKS = [
    PageLink(
        "explore",
        "explore",
        "Explore",
        (
            Setting("engine", "core", "engine", "core", "Engine", "From-scratch core", "transformers"),
            Setting(
                "text",
                "A dog barked at the cat.",
                "text",
                "A dog barked at the cat.",
                "Sentence",
                "A dog barked at the cat.",
                DEFAULT_TEXT,
            ),
            Setting(
                "pair",
                "It ran away.",
                "pair",
                "It ran away.",
                "Second sentence (encoders only, optional)",
                "It ran away.",
                "",
            ),
            Setting("present", "1", "present", True, "Presentation mode", "on", False),
            Setting("contrast", "1", "contrast", True, "High contrast", "on", False),
            Setting("layer", "3", "layer", 3, None, None, 0),
            Setting("head", "7", "head", 7, None, None, 0),
            Setting("shape", "lines", "head_shape", "lines", None, None, "heatmap"),
            Setting("words", "1", "words", True, "Words instead of tokens", "on", False),
            Setting("hide", "1", "hide_special", True, "Hide special tokens", "on", False),
            Setting("focus", "2", "focus_token", 2, "Focus on query token", "2: barked", -1),
            # "Why does this head look there?" (14 tokens with the pair): the query's default is the last token,
            # the key's the one the head looks at most (layer 0, head 0 when the link's layer and head are refused
            # as well: the last [SEP]).
            Setting("decompose", "1", "decompose_on", True, "Split a score into its sources", "on", False),
            Setting("score_query", "3", "decompose_query", 3, "Query (the token looking)", "3: barked", 13),
            Setting("score_key", "2", "decompose_key", 2, "Key (the token looked at)", "2: dog  (9%)", 13),
            # "What does the prediction depend on?" (a sentence encoder: the second sentence and the methods).
            Setting("attr", "1", "attr_on", True, "Score the tokens the prediction depends on", "on", False),
            Setting(
                "apair",
                "A bird sang.",
                "attr_pair",
                "A bird sang.",
                "Second sentence: the prediction explained is its similarity with the sidebar's sentence",
                "A bird sang.",
                "A dog sat on a mat.",
            ),
            Setting(
                "amethods",
                "occlusion,attention",
                "attr_methods",
                ["occlusion", "attention"],
                "Methods",
                "Occlusion (leave one out), Attention (last layer, mean of heads)",
                list(METHODS),
            ),
        ),
        shows=("Layer 3, head 7",),
    ),
    PageLink(
        "explore-writing",
        "explore",
        "Explore",
        (
            Setting("gen", "2", "gen_count", 2, None, None, 0),
            Setting("temp", "0.0", "gen_temperature", 0.0, "Temperature", "0.0", 1.0),
            Setting("topk", "5", "gen_top_k", 5, "Top-k", "5", 0),
            Setting("topp", "0.9", "gen_top_p", 0.9, "Top-p", "0.9", 1.0),
            Setting("seed", "7", "gen_seed", 7, "Seed", "7", 0),
            # The written tokens are at positions 4 and 5 (SmolLM2 writes " on the" after the sentence, greedy).
            Setting("gtok", "4", "gen_token", 4, "Written token", "4: \u25b8on", 5, shown_after="gen"),
            # The prompt token 2 (" sat") picked on the head view: the prediction at position 1, drawn without a widget.
            Setting("ptok", "2", "gen_prompt_token", 2, None, None, 0),
        ),
        query={"model": "smollm2", "text": "The cat sat"},
    ),
    PageLink(
        "explore-needle",
        "explore",
        "Explore",
        (
            Setting(
                "long", "needle", "long_doc", "needle", "Long document", "Needle in a haystack (retrieval heads)", "0"
            ),
            Setting(
                "needle",
                "The code word is maple.",
                "long_needle",
                "The code word is maple.",
                "Needle",
                "The code word is maple.",
                NEEDLE,
            ),
            Setting(
                "nq",
                "What is the code word?",
                "long_question",
                "What is the code word?",
                "Question (the model answers it)",
                "What is the code word?",
                NEEDLE_QUESTION,
            ),
            Setting("nlen", "512", "long_needle_tokens", 512, "Tokens", "512", 4096),  # SmolLM2 reads 8,192
            Setting("ndepth", "40", "long_needle_depth", 40, "Needle depth (% of the haystack before it)", "40", 50),
        ),
        query={"model": "smollm2"},
    ),
    PageLink(
        "compare-layers",
        "compare",
        "Compare",
        (
            Setting("layer", "1", "layer", 1, "Left layer", "1", 0),
            Setting("right_layer", "3", "compare_layer_b", 3, "Right layer", "3", 5),
            Setting("diff", "1", "cmp_layers_difference", True, "Show the difference (left − right)", "on", False),
            Setting(
                "summary",
                "confidence",
                "cmp_layers_metric",
                "confidence",
                "Per-layer summary",
                METRIC_DESCRIPTIONS["confidence"],
                "normalized_entropy",
            ),
        ),
    ),
    PageLink(
        "compare-sentences",
        "compare",
        "Compare",
        (
            Setting("compare", "sentences", "compare_mode", "sentences", "Compare", "Sentence vs sentence", "layers"),
            Setting(
                "text2",
                "A bird sang in the tree.",
                "compare_text",
                "A bird sang in the tree.",
                "Second sentence to compare",
                "A bird sang in the tree.",
                "The cat sat on the mat because it was hungry.",
            ),
            Setting("layer", "2", "layer", 2, "Layer", "2", 0),
            Setting(
                "summary",
                "mean_distance",
                "cmp_sentences_metric",
                "mean_distance",
                "Per-layer summary",
                METRIC_DESCRIPTIONS["mean_distance"],
                "normalized_entropy",
            ),
        ),
    ),
    PageLink(
        "compare-models",
        "compare",
        "Compare",
        (
            Setting("compare", "models", "compare_mode", "models", "Compare", "Model vs model", "layers"),
            Setting("model2", "minilm", "compare_model", "minilm", "Second model", MINILM, "smollm2"),
            Setting("engine2", "core", "compare_engine", "core", "Second engine", "From-scratch core", "transformers"),
            Setting("layer", "4", "layer", 4, "Layer of minilm", "4", 0),
            Setting("layer2", "1", "compare_other_layer", 1, "Layer of minilm", "1", 0),
            Setting(
                "summary",
                "prev_token_mass",
                "cmp_models_metric",
                "prev_token_mass",
                "Per-layer summary",
                METRIC_DESCRIPTIONS["prev_token_mass"],
                "normalized_entropy",
            ),
        ),
    ),
    PageLink(
        "roles",
        "roles",
        "Head roles",
        (
            Setting("engine", "core", "engine", "core", "Engine", "From-scratch core", "transformers"),
            Setting("sentences", "40", "roles_profile_sentences", 40, "Sentences", "40", PROFILE_SENTENCES),
            Setting(
                "causal",
                "1",
                "roles_causal",
                True,
                "Causal column: ablate each role's heads on this sentence",
                "on",
                False,
            ),
            Setting("colour_by", "role", "roles_color_by", "role", "Colour by", "role", "layer"),
            Setting(
                "measure",
                "confidence",
                "roles_measure",
                "confidence",
                "Measurement",
                METRIC_DESCRIPTIONS["confidence"],
                "normalized_entropy",
            ),
            Setting("layer", "2", "layer", 2, "Layer", "2", 0),
            Setting("head", "5", "head", 5, "Head", "5", 0),
            # The joint query-key view of the chosen head (ui/widgets/joint_qk.py).
            Setting("qk", "1", "roles_joint_qk", True, "Show its queries and keys over a corpus", "on", False),
            Setting("qk_sentences", "5", "roles_qk_sentences", 5, "Corpus sentences", "5", 40, shown_after="qk"),
            Setting("qk_method", "tsne", "roles_qk_method", "tsne", "Projection", "t-SNE", "pca", shown_after="qk"),
            Setting(
                "qk_colour", "pos", "roles_qk_colour", "pos", "Colour points by", "POS tag", "kind", shown_after="qk"
            ),
        ),
    ),
    PageLink(
        "ablate",
        "ablate",
        "Ablate",
        (
            Setting(
                "colour",
                "normalized_entropy",
                "ablate_colour",
                "normalized_entropy",
                "Colour the map by (and pick by)",
                "normalised entropy (this sentence)",
                "sink_mass",
            ),
            Setting("top", "3", "ablate_top_k", 3, "How many", "3", 5),
            Setting("heads", "L0H1,L2H3", "ablate_heads", ["L0H1", "L2H3"], "Heads to ablate", "L0H1, L2H3", []),
            Setting(
                "ablation",
                "mean",
                "ablate_kind",
                "mean",
                "Ablation",
                "mean (its average over reference sentences)",
                "zero",
            ),
            Setting("later_layer", "4", "ablate_layer", 4, "Attention of a later layer", "4", 1),
            Setting("sentences", "10", "ablate_sentences", 10, "UD EWT dev sentences", "10", 20),
            Setting("method", "ablation", "ablate_method", "ablation", "Method", "ablation", "gradient"),
            Setting("orders", "2", "ablate_seeds", 2, "Random orders", "2", 3),
        ),
    ),
    PageLink(
        "positions",
        "positions",
        "Positions",
        (
            Setting("positions", "50", "pe_positions", 50, "Positions", "50", 100),
            Setting("d_model", "32", "pe_d_model", 32, "d_model (dimensions)", "32", 64),
            Setting("dims", "1,4,9", "pe_channels", [1, 4, 9], "Dimensions to draw", "1, 4, 9", [0, 1, 16, 32, 62]),
            Setting("similarity", "cosine", "pe_metric", "cosine", "Similarity", "cosine", "dot"),
            Setting("p", "7", "pe_p", 7, "Position p", "7", 5),
            Setting("k", "-3", "pe_k", -3, "Offset k", "-3", 3),
            Setting("learned", "64", "pe_learned_positions", 64, "Positions to compare", "64", 128),
        ),
    ),
    PageLink(
        "classroom-random",
        "classroom",
        "Classroom: multi-head attention by hand",
        (
            Setting("numbers", "random", "cls_source", "random", "Numbers", "Random numbers, any size", "words"),
            Setting("length", "6", "cls_seq_len", 6, "Sequence length", "6", 4),
            Setting("d_model", "12", "cls_d_model", 12, "d_model", "12", 8),
            Setting("heads", "3", "cls_heads", 3, "Heads", "3", 2),
            Setting("seed", "7", "cls_seed", 7, "Random seed", "7", 0),
            Setting("score", "dot", "cls_score", "dot", "Score function", "dot product", "scaled"),
            Setting(
                "causal",
                "1",
                "cls_causal",
                True,
                "Causal mask (a token sees only itself and earlier tokens)",
                "on",
                False,
            ),
            Setting("follow", "2", "cls_head", 2, "Head to follow", "head 3", 0),
            Setting("step", "3", "cls_step", 3, None, None, 1),
        ),
        shows=("Step 3 of 10",),
    ),
    PageLink(
        "classroom-tutorial",
        "classroom",
        "Classroom: multi-head attention by hand",
        (
            Setting(
                "numbers",
                "tutorial",
                "cls_source",
                "tutorial",
                "Numbers",
                "A popular tutorial's worked example",
                "words",
            ),
            Setting("all", "1", "cls_all", True, "All steps on one page", "on", False),
            Setting("printed", "V1", "cls_printed", "V1", "Matrix", "V1", "Q1"),
            # Step 9 (SmolLM2 predicting and writing; its 30 layers: the middle one, 15, by default).
            Setting(
                "dprompt",
                "The capital of France is",
                "cls_dec_prompt",
                "The capital of France is",
                "Sentence",
                "The capital of France is",
                "The cat sat on the",
            ),
            Setting("dtemp", "0.5", "cls_dec_temperature", 0.5, "Temperature", "0.5", 1.0),
            Setting("dwrite", "1", "cls_dec_write", True, "Let the model write 5 tokens", "on", False),
            Setting("ddraw", "3", "cls_dec_draw", 3, "Draw", "3", 0),
            Setting("dlayer", "4", "cls_dec_layer", 4, "Layer whose heads are averaged", "4", 15),
            # Step 10 ("Is attention explanation?"), on the one page of every step.
            Setting("amodel", "minilm", "cls_attr_model", "minilm", "Model", "minilm", "smollm2"),
            Setting(
                "atext",
                "The dog ran home.",
                "cls_attr_text",
                "The dog ran home.",
                "The class's sentence",
                "The dog ran home.",
                "When Mary and John went to the store, John gave a drink to",
            ),
        ),
        shows=("Step 8. Why divide by the square root of d_k?",),
    ),
    # The Classroom in Chinese (``lang=zh``): the language comes back from the link, and the page's settings show
    # in Chinese (labels and choices from ui/locales/zh.json).
    PageLink(
        "classroom-zh",
        "classroom",
        "课堂：手算多头注意力",
        (
            Setting("lang", "zh", "lang", "zh", "Language / 语言", "中文", "en"),
            Setting("numbers", "random", "cls_source", "random", "数字", "随机数，任意尺寸", "words"),
            Setting("follow", "1", "cls_head", 1, "要跟踪的头", "头 2", 0),
            Setting("step", "2", "cls_step", 2, None, None, 1),
        ),
        shows=("第 2 步，共 10 步",),
    ),
    PageLink(
        "lab",
        "lab",
        "Lab: watch heads being born",
        (
            Setting(
                "task",
                "positional",
                "lab_task",
                "positional",
                "Task",
                "Positional: repeat the token k steps back",
                "induction",
            ),
            Setting("size", "2x2", "lab_size", "2x2", "Model size", "2 layers x 2 heads, d_model 32 (fastest)", "2x4"),
            Setting("steps", "250", "lab_steps", 250, "Training steps", "250", 1000),
            Setting(
                "encoding", "sinusoidal", "lab_positions", "sinusoidal", "Positional encoding", "sinusoidal", "learned"
            ),
            Setting("seed", "5", "lab_seed", 5, "Seed", "5", 0),
            Setting("k", "4", "lab_offset", 4, "k (positional task)", "4", 3),
        ),
    ),
    PageLink(
        "deeper",
        "deeper",
        "Deeper",
        (
            Setting("deeper_layer", "2", "deeper_layer", 2, "After layer", "2", 5),
            Setting("flow", "1", "deeper_flow", True, "Also compute attention flow (max-flow)", "on", False),
            Setting("deeper_head", "5", "deeper_head", 5, "Head", "5", 0),
            Setting("query", "3", "deeper_query", 3, "Query token", "3: chased", 1),
            Setting(
                "search_by",
                "attention",
                "deeper_search_kind",
                "attention",
                "Compare tokens by",
                "attention pattern",
                "representation",
            ),
            Setting("searched", "50", "deeper_search_size", 50, "Sentences searched", "50", 100),
            Setting("search", "1", "deeper_search", True, "Search the corpus", "on", False),
        ),
        query={"text": "The dog chased the ball."},
    ),
    PageLink(
        "circuits",
        "circuits",
        "Circuits",
        (
            Setting("task", "custom", "circuits_task", "custom", "Prompt pair", "Your own prompt pair", "ioi"),
            Setting(
                "clean",
                "The capital of Spain is",
                "circuits_clean",
                "The capital of Spain is",
                "Clean prompt",
                "The capital of Spain is",
                "When Mary and John went to the store, John gave a drink to",
            ),
            Setting(
                "corrupted",
                "The capital of Italy is",
                "circuits_corrupted",
                "The capital of Italy is",
                "Corrupted prompt",
                "The capital of Italy is",
                "When Mary and John went to the store, Mary gave a drink to",
            ),
            Setting("answer", " Madrid", "circuits_answer", " Madrid", "Answer", " Madrid", " Mary"),
            Setting("foil", " Rome", "circuits_foil", " Rome", "Foil", " Rome", " John"),
            Setting(
                "method",
                "exact",
                "circuits_method",
                "exact",
                "Patching",
                "exact activation patching (every head)",
                "attribution",
            ),
        ),
        query={"model": "smollm2"},
    ),
    PageLink(
        "root-positions",
        "positions",
        "Positions",
        (Setting("p", "9", "pe_p", 9, "Position p", "9", 5),),
        root=True,
    ),
    PageLink(
        "heads",
        "heads",
        "Heads",
        (
            Setting("hsent", "12", "heads_sentences", 12, "UD dev sentences", "12", CARD_SENTENCES),
            Setting("find", "sink", "heads_search", "sink", "Search the heads", "sink", None),
            Setting("hlayer", "2", "heads_layer", 2, "Layer", "2", 0),
            Setting("hhead", "3", "heads_head", 3, "Head", "3", 0),
            Setting("hlong", "1", "heads_long", True, "and the long documents", "on", False),
        ),
    ),
]
