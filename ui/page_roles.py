"""The Head roles page's settings (``RolesSettings``, declared once: ``ui.page_settings``) and its logic: the
corpus profile a session asks for (one at a time on a classroom server), the roles on the sentence's or the
corpus's measurements, the held-out table's rows and one head's measurements. ``pages/roles.py`` draws them."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd

import mha_core
from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from mha_core.analysis.roles import SYNTACTIC_MIN_MARGIN
from mha_core.errors import HeadscopeError
from mha_core.interventions.joint_qk import METHODS as QK_METHODS
from ui import computations, compute, page_state
from ui.i18n import chinese, t
from ui.page_settings import PageSettings, setting
from ui.settings import PROFILE_SENTENCES
from ui.widgets import messages

ROLE_SOURCES = {"sentence": "this sentence", "corpus": "the corpus"}
COLOUR_BY = {"layer": "layer", "role": "role"}
QK_COLOURS = {"kind": "query or key", "position": "position", "pos": "POS tag"}
PROFILE_BUSY = "Another visitor's corpus profile is running on this server. Try again in a minute."


@dataclass(frozen=True)
class RolesSettings(PageSettings):
    """Every setting of the Head roles page (the layer and head are the app's shared ones: ``ui.widgets.pickers``).
    The profile's largest size is the server's (``ServerSettings.max_profile_sentences``), given where drawn;
    the measurements offered are the sentence's numeric columns."""

    sentences: int = setting(
        "roles_profile_sentences", "sentences", "number", PROFILE_SENTENCES, label="Sentences", minimum=10
    )
    source: str = setting(
        "roles_source",
        "roles_from",
        "choice",
        "sentence",
        label="Positional, delimiter and broad roles from",
        help="The corpus: mean of every measurement over {sentences} UD EWT dev sentences.",
        options=ROLE_SOURCES,
    )
    causal: bool = setting(
        "roles_causal", "causal", "flag", False, label="Causal column: ablate each role's heads on this sentence"
    )
    min_count: int = setting(
        "roles_min_count",
        "min_count",
        "number",
        20,
        label="Minimum examples per relation",
        minimum=1,
        maximum=1000,
    )
    colour_by: str = setting("roles_color_by", "colour_by", "choice", "layer", label="Colour by", options=COLOUR_BY)
    measure: str = setting("roles_measure", "measure", "choice", "normalized_entropy", label="Measurement")
    # The joint query-key view of the chosen head (``ui.widgets.joint_qk``).
    joint_qk: bool = setting("roles_joint_qk", "qk", "flag", False, label="Show its queries and keys over a corpus")
    qk_sentences: int = setting(
        "roles_qk_sentences", "qk_sentences", "number", 40, label="Corpus sentences", minimum=2, maximum=200
    )
    qk_method: str = setting("roles_qk_method", "qk_method", "choice", "pca", label="Projection", options=QK_METHODS)
    qk_colour: str = setting(
        "roles_qk_colour", "qk_colour", "choice", "kind", label="Colour points by", options=QK_COLOURS
    )


# ---- the corpus profile -------------------------------------------------------------------------------
def ask_profile(model_name: str, sentences: int) -> None:
    """ "Profile heads": asked for until it is done (a run stopped meanwhile, a connection lost for a moment,
    leaves the profile going in the background, and the next run waits for it again: ``compute.background``)."""
    page_state.remember(page_state.ROLES_PROFILE_WANTED, model_name, int(sentences))


def run_profile(model_name: str, is_causal: bool, classroom: bool) -> tuple[str, str] | None:
    """Run the profile this session asked for, if any (and the decoder scores of a decoder). A class shares the
    cores: one profile at a time on a classroom server. Returns what to tell the visitor, ("warning" or "error",
    text), or None; a failure that is not the library's refusal is raised."""
    if not page_state.has(page_state.ROLES_PROFILE_WANTED, model_name):
        return None
    lock = compute.shared().profile_lock if classroom else contextlib.nullcontext()
    if classroom and not lock.acquire(blocking=False):
        page_state.forget(page_state.ROLES_PROFILE_WANTED, model_name)
        return "warning", PROFILE_BUSY
    try:
        computations.corpus_profile(model_name, page_state.of_model(page_state.ROLES_PROFILE_WANTED, model_name))
        sentences = page_state.forget(page_state.ROLES_PROFILE_WANTED, model_name)
        page_state.remember(page_state.ROLES_PROFILE, model_name, sentences)
        if is_causal:
            computations.decoder_scores(model_name)
            page_state.remember(page_state.ROLES_DECODER, model_name, True)
    except Exception as error:  # not Streamlit's stop of this run: the profile goes on for the next run
        page_state.forget(page_state.ROLES_PROFILE_WANTED, model_name)
        if not isinstance(error, HeadscopeError):
            raise
        return "error", messages.public_message(error)
    finally:
        if classroom:
            lock.release()
    return None


def profiled_sentences(model_name: str) -> int | None:
    """The sentences of the corpus profile this session has for ``model_name``, or None."""
    return page_state.of_model(page_state.ROLES_PROFILE, model_name)


def roles_of(run, model_name: str, metrics: pd.DataFrame, semantic: pd.DataFrame | None, source: str = "sentence"):
    """(roles, primary roles, dependency table or None): the sentence's measurements, or the corpus averages
    (``source`` "corpus"), plus every table this session has profiled."""
    dependency = coreference = decoder = None
    sentences = profiled_sentences(model_name)
    if sentences is not None:
        corpus_metrics, dependency, coreference = computations.corpus_profile(model_name, sentences)
        if source == "corpus":
            metrics = corpus_metrics
    if page_state.of_model(page_state.ROLES_DECODER, model_name):
        decoder = computations.decoder_scores(model_name)
    roles = mha_core.head_roles(
        run, metrics=metrics, dependency=dependency, coreference=coreference, decoder=decoder, semantic=semantic
    )
    return roles, mha_core.primary_roles(roles, run.num_layers, run.num_heads), dependency


# ---- what the tables show -----------------------------------------------------------------------------------
# The held-out table's columns as shown (mha_core.best_heldout_heads with the head, the halves' accuracies and the
# margin's interval written out, ``heldout_rows``): label, help. The role column first and pinned with the
# relation: they stay in view if the table scrolls sideways.
HELDOUT_TABLE = {
    "named": ("named", 60, "the held-out test passed: the head gets the role"),
    "relation": ("relation", 70, ""),
    "direction": ("direction", 60, ""),
    "head_name": ("head", 55, "layer and head, chosen on the selection half"),
    "count": ("cases", 50, "cases of the relation in all profiled sentences"),
    "selection_text": (
        "selection half",
        95,
        "the head's accuracy on the half it was chosen on, against the best fixed offset's there",
    ),
    "heldout_text": (
        "held-out half",
        95,
        "the same head on the other half, against the best fixed offset of that half: the test's baseline (chosen "
        "with hindsight there, it can only favour the offset, never the head)",
    ),
    "selected_text": (
        "sel. offset",
        70,
        "the offset chosen on the selection half, scored on the held-out half: reported, not tested (it can fall "
        "below the best offset there, which would favour the head)",
    ),
    "margin_text": ("margin (95% CI)", 150, "held-out head minus held-out offset, interval over sentences"),
    "heldout_sentences": (
        "sentences",
        65,
        "held-out sentences with a case: the test's Student's t has this many - 1 degrees of freedom",
    ),
    "heldout_rank": ("rank", 40, "1: still the best head on the held-out half"),
    "holm_p_value": (
        "Holm p",
        70,
        f"one-sided test of a held-out margin above {SYNTACTIC_MIN_MARGIN:+.0%}, Holm-adjusted",
    ),
}
HELDOUT_NUMBERS = {"count": "%d", "heldout_sentences": "%d", "heldout_rank": "%d", "holm_p_value": "%.1e"}


def heldout_rows(best: pd.DataFrame) -> pd.DataFrame:
    """``best_heldout_heads`` with the columns the table shows written out: the head as "L1 H4", each half's
    head against offset as "68% vs 40%", the held-out margin with its interval."""

    def percent(value) -> str:
        return f"{value:.0%}" if np.isfinite(value) else "-"

    def margin(row) -> str:
        if not np.isfinite(row["heldout_margin"]):
            return "-"
        interval = (
            f" ({row['heldout_margin_low'] * 100:+.1f}, {row['heldout_margin_high'] * 100:+.1f})"
            if np.isfinite(row["heldout_margin_low"])
            else ""
        )
        return f"{row['heldout_margin']:+.1%}{interval}"

    rows = [row for _, row in best.iterrows()]
    return best.assign(
        head_name=[f"L{int(r['layer'])} H{int(r['head'])}" for r in rows],
        selection_text=[
            f"{percent(r['selection_accuracy'])} vs {percent(r['selection_baseline_accuracy'])}" for r in rows
        ],
        heldout_text=[f"{percent(r['heldout_accuracy'])} vs {percent(r['heldout_baseline_accuracy'])}" for r in rows],
        selected_text=[percent(r["heldout_selected_baseline_accuracy"]) for r in rows],
        margin_text=[margin(r) for r in rows],
    )


def measurements(metrics: pd.DataFrame) -> list[str]:
    """The measurements a per-layer curve can show: the numeric columns of a head's row."""
    return [
        c
        for c in metrics.columns
        if c not in ("layer", "head", "num_queries") and pd.api.types.is_numeric_dtype(metrics[c])
    ]


def head_measurements(metrics: pd.DataFrame, layer: int, head: int) -> pd.DataFrame:
    """One head's every measurement: its description, its value as shown (4 significant digits), its column."""
    row = metrics[(metrics["layer"] == layer) & (metrics["head"] == head)].iloc[0]
    return pd.DataFrame(
        {
            t("measurement"): [t(METRIC_DESCRIPTIONS.get(name, name)) for name in row.index[2:]],
            t("value"): [str(v) if isinstance(v, str) else f"{v:.4g}" for v in row.to_numpy()[2:]],
            t("column"): row.index[2:],
        }
    )


# ---- the roles and their evidence as shown -----------------------------------------------------------------
# The evidence notes ``mha_core.head_roles`` writes (English, numbers inside), as the catalog's templates: a note is
# matched against each and shown as its entry with the same values (each value shown in its turn: an interval, a
# unit). A note no template matches shows as it is.
EVIDENCE_TEMPLATES = (
    "argmax at offset {offset} in {score} of {unit} ({interval}); a random argmax: {baseline}; needs >= {threshold}",
    "{score} of attention on positions of no content ([CLS], [SEP], BOS or the first token; {interval}); even "
    "attention: {baseline}. A no-op or attention sink; needs >= {threshold}",
    "{score} of attention on punctuation ({interval}); even attention: {baseline}; needs >= {threshold}",
    "normalised entropy {score} (1 = even over the visible keys; {interval}); needs >= {threshold}",
    "{label} score {score} on repeated random tokens ({interval}); even attention: {baseline}; needs >= {threshold}",
    "argmax from the pronoun lands on its antecedent in {accuracy} of {n} pronouns (needs >= {threshold}, >= "
    "{count} pronouns); prefers the antecedent to the distractor in {score} ({interval}) vs {baseline} for the "
    "better of first/nearest candidate (needs a margin >= {margin})",
    "argmax from the pronoun lands on its antecedent in {accuracy} of {n} pronouns (needs >= {threshold}, >= "
    "{count} pronouns)",
    "Pearson r = {score} (95% CI {low} to {high}, {n} pairs) between its weights and the cosine similarity of the "
    "tokens' input embeddings; needs >= {threshold} over >= {sentences} sentences",
    "finds the {direction} of '{relation}' in {score} of {n} held-out cases ({interval}) vs {baseline} for the best "
    "offset{offset} on the held-out half{chosen}; margin {margin}, needs >= {threshold}{control}: one-sided p = {p} "
    "(t, {df} df), Holm-adjusted over {tried} heads x relations x directions tried = {holm} (needs <= {alpha}). "
    "Selection half: {selection} of {selection_n} cases vs {selection_baseline}",
    "; the selection half's offset {offset} scores {score} there",
    "; word-type control: the best rule on the held-out half ({rule}) scores {score}, margin {margin}",
    "95% CI {low} to {high}, n = {n} {unit}",
    "95% CI {low} to {high}, n = {n}",
    "95% CI {low} to {high}",
    "n = {n} {unit}",
)
# Words a role's name, a unit or a direction is made of ("positional:previous", "decoder:induction", "syntactic:
# nsubj:parent"); a dependency relation stays as UD writes it.
ROLE_WORDS = (
    "positional", "previous", "self", "next", "sink", "delimiter", "broad", "decoder", "previous_token",
    "duplicate_token", "induction", "prefix_matching", "syntactic", "parent", "child", "coreference", "semantic",
    "queries", "sentences", "sequences", "no interval", "none", "previous-token", "duplicate-token",
    "prefix-matching",
)  # fmt: skip
FIELD = re.compile(r"\\\{(\w+)\\\}")


@cache
def template_pattern(template: str) -> re.Pattern:
    """``template`` as a pattern whose groups are its fields (each the shortest text that makes the whole match)."""
    return re.compile(FIELD.sub(lambda m: f"(?P<{m[1]}>.*?)", re.escape(template)), re.DOTALL)


def shown_by_templates(text: str, templates: tuple[str, ...], words: tuple[str, ...]) -> str:
    """A text the library wrote from one of ``templates`` (catalog keys with ``{fields}``), in the session's
    language: the first template it matches, as its entry with the same values, each value shown in its turn (a
    nested template, one of ``words`` by the catalog, else as it is). English: as it is."""
    if not chinese():
        return text
    for template in templates:
        matched = template_pattern(template).fullmatch(text)
        if matched is not None:
            values = {name: shown_by_templates(value, templates, words) for name, value in matched.groupdict().items()}
            return t(template, **values)
    return t(text) if text in words else text


def evidence_shown(text: str) -> str:
    """An evidence note (or a part of one) in the session's language."""
    return shown_by_templates(text, EVIDENCE_TEMPLATES, ROLE_WORDS)


def role_shown(role: str) -> str:
    """A role's name in the session's language: each of its words, a dependency relation in code type ("句法:
    `nsubj` 父节点"). English: as the library names it ("syntactic:nsubj:parent")."""
    if not chinese():
        return role
    parts = role.split(":")
    if parts[0] == "syntactic" and len(parts) == 3:
        return f"{t('syntactic')}: `{parts[1]}` {t(parts[2])}"
    return ": ".join(t(part) for part in parts)


def roles_shown(roles: pd.DataFrame) -> pd.DataFrame:
    """``roles`` (or primary roles) with their role names and evidence notes in the session's language."""
    return roles.assign(
        role=[role_shown(role) for role in roles["role"]], evidence=[evidence_shown(e) for e in roles["evidence"]]
    )


def role_effect_shown(effect: pd.DataFrame) -> pd.DataFrame:
    """The role ablation's table (``role_group_ablation``) with its words and its columns' names in the session's
    language."""
    shown = effect.assign(group=[t(group) for group in effect["group"]], measure=[t(m) for m in effect["measure"]])
    return shown.rename(columns={column: t(column) for column in shown.columns})
