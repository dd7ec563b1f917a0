"""What the pages ask the server to compute: each function builds an operation of the library
(``mha_core.operations``, its input tokenized once) from a page's values and hands it to ``ui.compute.compute``,
the one gated, budgeted path. The operation names its value (``key``), says what it holds (``peak_bytes``) and its
share of the server (``work_class``): nothing here builds a key or estimates bytes. Also what is computed from a
run without a model (``from_run``: operations run on the run, such as its metrics and rollout), and downloads that
make their run again when clicked (``deferred``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import streamlit as st

import mha_core
from mha_core.errors import HeadscopeError, quoted
from mha_core.models.long import NeedlePrompt
from mha_core.operations import (
    Attention,
    Attribution,
    Coreference,
    DecoderScores,
    Importance,
    InductionExperiment,
    LabAblation,
    LabExample,
    LogitLens,
    LongAttention,
    NeedleTest,
    Neurons,
    Patching,
    Profile,
    RoleAblation,
    SearchIndex,
    SearchVector,
    Seq2SeqAttention,
    most_tokens_within,
    prompt,
)
from mha_core.operations.derived import Flow, FromRun, HeadDistances, Metrics, Rollout, SemanticScores
from ui import circuits, session
from ui.budget import HEAVY, MB, OverBudget
from ui.compute import Stopped, compute, get_model, loaded, model_key, ready, shared

LongRunStopped = Stopped  # the visitor pressed Stop: a long run ends at its next block


# ---- one text's runs -----------------------------------------------------------------------------
# The runs made lately, by key: a download made again once its run has left memory (``deferred``), the runs made
# from a run (its norms). An operation holds a text's tokens, not its attention: a few kilobytes.
MADE_RUNS = 256
_made: OrderedDict[tuple, Attention] = OrderedDict()
_made_lock = threading.Lock()


def remember(operation: Attention) -> Attention:
    """``operation``, kept among the runs made lately (``operation_of``)."""
    with _made_lock:
        _made[operation.key] = operation
        _made.move_to_end(operation.key)
        while len(_made) > MADE_RUNS:
            _made.popitem(last=False)
    return operation


def operation_of(run) -> Attention | None:
    """The operation that made ``run`` (a view of it keeps its key), if it was made lately."""
    key = run.metadata.get("cache_key")
    with _made_lock:
        return None if key is None else _made.get(tuple(key))


def get_run(model_name: str, engine: str, text: str, text_pair: str | None = None, bos: bool | None = None):
    """The ``AttentionRun`` for these inputs: from the shared cache, or computed in a compute slot, layer by
    layer, stopping if this session goes away."""
    model = get_model(model_name)
    if getattr(model, "is_encoder_decoder", False):
        raise HeadscopeError(
            f"{quoted(model_name)} is an encoder-decoder model: Explore and Compare show its encoder, decoder and "
            "cross-attention; this page reads encoder-only and decoder-only models."
        )
    # A model with a language-model head keeps its prediction from the same pass (Explore's next-token table).
    predict = model.lm_head_kind is not None
    return compute(remember(Attention.of(model, text, text_pair or None, bos, engine=engine, predict=predict)), model)


def get_ablated_run(
    model_name: str,
    engine: str,
    text: str,
    text_pair: str | None,
    bos: bool | None,
    heads: tuple[tuple[int, int], ...],
    ablation: str,
):
    """The run with ``heads`` ablated, with its losses, cached like ``get_run`` (``heads=()``: the unablated run
    with its losses)."""
    model = get_model(model_name)
    settings = dict(engine=engine, ablate=tuple(heads), ablation=ablation, losses=True)
    return compute(Attention.of(model, text, text_pair or None, bos, **settings), model)


def run_with_norms(run):
    """``run`` again with norm-based attention (``norms=True``), cached."""
    model = get_model(run.model_name)
    made = operation_of(run) or Attention.of(model, run.text, run.text_pair, run.metadata.get("bos"), engine=run.engine)
    return compute(dataclasses.replace(made, norms=True), model)


def get_seq2seq_run(model_name: str, engine: str, source: str, target: str | None, *, stoppable: bool = True):
    """An encoder-decoder model's ``Seq2SeqRun`` (``target`` None: the model writes it), cached (``stoppable=False``:
    never stopped, for a download made outside a script run)."""
    model = get_model(model_name)
    return compute(Seq2SeqAttention.of(model, source, target, engine), model, stoppable=stoppable)


def neuron_view(run, layer: int, head: int, query: int):
    """``mha_core.neuron_view`` of head (``layer``, ``head``) for token ``query`` of ``run``, cached."""
    model = get_model(run.model_name)
    return compute(Neurons(model.name, run.metadata["token_ids"], layer, head, query, engine=run.engine), model)


def search_vector(run, query: int, layer: int, head: int, kind: str):
    """The search vector of token ``query`` of ``run`` (``mha_core.interventions.search.query_vector``)."""
    model = get_model(run.model_name)
    return compute(SearchVector(model.name, run.metadata["token_ids"], query, layer, head, kind=kind), model)


def deferred(view, make):
    """A zero-argument callable for ``st.download_button(data=...)`` that returns ``make(view)`` when clicked,
    without holding ``view``: Streamlit keeps a session's download callables as long as the session, and a
    callable holding a 283 MB run would keep it out of the budget's reach. The run is held weakly; once it
    has left memory, a click computes its operation again (the cached copy if there is one) and reshapes it as
    ``view`` was (word level, without special tokens)."""
    held = weakref.ref(view)
    made = operation_of(view)
    words = view.level == "word"
    without_special = bool(view.metadata.get("special_tokens_removed"))
    if made is None:  # not from get_run: nothing to make it again from, so keep it
        return lambda: make(view)

    def data():
        current = held()
        if current is None:
            current = compute(made, loaded(made.model), stoppable=False)  # a download is made outside a run
            current = current.to_words() if words else current
            current = current.without_special() if without_special else current
        return make(current)

    return data


# ---- what is computed from a run without a model --------------------------------------------------
def from_run(operation: FromRun, run):
    """``operation`` (``mha_core.operations.derived``: a measurement or view of ``run`` that runs no model) on
    ``run``, through ``compute`` like every computation, cached under the run's key (``source_key``), or run
    uncached for a run that did not come from an operation."""
    return compute(operation, run, keep=operation.cacheable)


def metrics_for(run):
    """``mha_core.head_metrics(run)``: one row per layer and head, cached with the run it came from."""
    return from_run(Metrics.of(run), run)


def rollout(run):
    """``mha_core.attention_rollout(run)``, cached with the run."""
    return from_run(Rollout.of(run), run)


def flow(run, layer: int):
    """``mha_core.attention_flow(run, layer=layer)``, cached with the run."""
    return from_run(Flow.of(run, layer=layer), run)


# Head distances cost (head pairs) x n^2; past this many tokens they average over this many query rows.
DISTANCE_MAX_QUERIES = 128


def sentence_analysis(model_name: str, run):
    """(metrics, semantic scores, head distances) of one run, for the Roles page."""
    semantic = None
    token_ids = run.metadata.get("token_ids")
    if token_ids is not None:  # the input embeddings are a table look-up, not a forward pass
        embeddings = get_model(model_name).input_embeddings(token_ids)
        semantic = from_run(SemanticScores.of(run, embeddings=embeddings), run)
    distances = from_run(HeadDistances.of(run, max_queries=DISTANCE_MAX_QUERIES), run)
    return metrics_for(run), semantic, distances


@st.cache_data(show_spinner=False)
def saturation_table(n_keys: int = 16):
    """``mha_core.softmax_saturation``: the same curve for every visitor."""
    return mha_core.softmax_saturation(n_keys=n_keys)


# ---- long documents -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _long_operation(key: str, text: str, bos: bool | None, needle: NeedlePrompt | None) -> LongAttention | NeedleTest:
    if needle is not None:
        return NeedleTest(key, needle)
    return LongAttention.of(loaded(key), text=text, bos=bos)


def long_operation(
    model_name: str, text: str, token_ids: Sequence[int] | None = None, bos: bool | None = None, needle=None
) -> LongAttention | NeedleTest:
    """A document's long run (``bos``: with the BOS token; None: the model's default), token ids' taken as they
    are, or a needle test (``needle``: a ``NeedlePrompt`` the model answers), tokenized once for its check, its
    estimate and its run (a page asks for it twice: ``long_run_ready``, then ``long_run``)."""
    key = get_model(model_name).name
    if token_ids is not None and needle is None:
        return LongAttention.of(loaded(key), token_ids=token_ids)
    return _long_operation(key, text, None if bos is None else bool(bos), needle)


def long_run_ready(
    model_name: str, text: str, token_ids: Sequence[int] | None = None, bos: bool | None = None, needle=None
) -> bool:
    """True when ``long_run``'s value for these inputs is in the server's cache (showing it computes nothing)."""
    return ready(long_operation(model_name, text, token_ids, bos, needle))


def longest_long_run(model) -> int:
    """The most tokens of ``model`` whose long run fits in what this server gives heavy work (0: not even one)."""
    return most_tokens_within(model, shared().cache.limit(HEAVY.share))


def check_long_run_fits(model, operation: LongAttention | NeedleTest) -> None:
    """A clear refusal (``OverBudget``) for a long run (or needle test) larger than heavy work's share of the
    budget: never run alone over it."""
    nbytes, limit = operation.peak_bytes(model), shared().cache.limit(HEAVY.share)
    if nbytes > limit:
        longest = longest_long_run(model)
        raise OverBudget(
            nbytes,
            limit,
            HEAVY.share,
            f"Every head of {operation.num_tokens:,} tokens of {model.name} needs about {nbytes / MB:,.0f} MB at its "
            f"peak, more than the {limit / MB:,.0f} MB this server gives heavy work (long documents, tests, profiles, "
            "training), so it does not run here. "
            + (f"At most {longest:,} tokens fit: choose fewer tokens or a shorter document." if longest else ""),
        )


def long_run(
    model_name: str,
    text: str,
    stop: threading.Event,
    token_ids: Sequence[int] | None = None,
    bos: bool | None = None,
    needle=None,
):
    """The ``LongRun`` of ``text`` up to the model's context length (``bos``: with the BOS token as the page's
    sentence; None: the model's default), of ``token_ids`` taken as they are, or a needle test (``needle``: the
    model answers the ``NeedlePrompt``, then the run reads prompt and answer): in a job of the session's with a
    progress bar that says how long is left, its bytes reserved first; ``stop`` set ends it at its next block
    (``LongRunStopped``)."""
    model = get_model(model_name)
    operation = long_operation(model_name, text, token_ids, bos, needle)
    check_long_run_fits(model, operation)
    return compute(operation, model, stop=stop)


# ---- corpora ---------------------------------------------------------------------------------------------
SEARCH_BATCH = 16  # sentences per forward pass when a corpus is indexed
PROFILE_BATCH = 16  # sentences per forward pass of a corpus profile


def _search_index(model_name: str, layer: int, head: int, kind: str, max_sentences: int) -> SearchIndex:
    return SearchIndex(model_key(model_name), layer, head, kind, max_sentences, batch_size=SEARCH_BATCH)


def corpus_index_ready(model_name: str, layer: int, head: int, kind: str, max_sentences: int) -> bool:
    """True when ``corpus_index``'s value for these inputs is in the server's cache."""
    return ready(_search_index(model_name, layer, head, kind, max_sentences))


def corpus_index(model_name: str, layer: int, head: int, kind: str, max_sentences: int):
    """The search index of the first ``max_sentences`` UD English EWT dev sentences, built once per (model, layer,
    head, kind) with a progress bar, and kept in the shared cache."""
    return compute(_search_index(model_name, layer, head, kind, max_sentences), get_model(model_name))


@st.cache_data(show_spinner=False, max_entries=8)
def corpus_profile(model_name: str, max_sentences: int):
    """(metrics, dependency, coreference) over the first ``max_sentences`` UD EWT dev sentences."""
    model = get_model(model_name)
    result = compute(Profile(model.name, max_sentences=max_sentences, batch_size=PROFILE_BATCH), model, keep=False)
    coreference = compute(Coreference(model.name, PROFILE_BATCH), model, keep=False)  # st.cache_data keeps them
    return result.metrics, result.dependency, coreference


# ---- causal evidence (the Ablate page, the Roles page's causal column) -----------------------------------
@st.cache_data(show_spinner=False, max_entries=8)
def decoder_scores(model_name: str):
    """Previous-token, duplicate, induction and prefix-matching scores on repeated random tokens."""
    model = get_model(model_name)
    return compute(DecoderScores(model.name), model, keep=False)  # st.cache_data keeps it


INDUCTION_BATCH = 8  # sequences per pass of the induction experiment


@st.cache_data(show_spinner=False, max_entries=8)
def induction_table(model_name: str, top_k: int, draws: int, role: str, ablation: str):
    """``mha_core.induction_experiment``: top-k heads of a role vs k random heads on repeated random tokens."""
    scores = decoder_scores(model_name)
    model = get_model(model_name)
    experiment = InductionExperiment(model.name, top_k, draws, role, ablation, batch=INDUCTION_BATCH, scores=scores)
    return compute(experiment, model, keep=False)  # st.cache_data keeps it


IMPORTANCE_BATCH = 8  # texts per pass of head importance (``mha_core.head_importance``'s default)


@st.cache_data(show_spinner=False, max_entries=8)
def importance_and_pruning(model_name: str, sentences: int, method: str, seeds: int, steps: int):
    """(importance, pruning curves: importance order and ``seeds`` random orders) over UD EWT dev sentences."""
    model = get_model(model_name)
    settings = dict(method=method, batch_size=IMPORTANCE_BATCH, pruning=True, steps=steps, seeds=seeds)
    return compute(Importance(model.name, sentences, **settings), model, keep=False)  # st.cache_data keeps it


def role_ablation(model_name: str, run, primary):
    """For each role group of ``primary`` (``mha_core.primary_roles``): what ablating all its heads does to this
    sentence, cached."""
    model = get_model(model_name)
    return compute(RoleAblation.of(model, run.text, primary), model)


# ---- the Lab ---------------------------------------------------------------------------------------------
def lab_ablation(lab, layer: int, head: int) -> dict:
    """The lab model's loss with one head ablated, beside the intact model's (``mha_core.Lab.ablation``)."""
    return compute(LabAblation(lab.config, layer, head), lab, keep=False)  # the lab changes while it trains


def open_lab_in_explore(lab) -> None:
    """Explore shows this session's lab model on its fixed example, until ``session.close_lab_run``."""
    session.set_lab_run(compute(LabExample(lab.config), lab, keep=False))


# ---- the Circuits page: logit attribution, patching, the logit lens (mha_core.interventions) --------------------
def circuit_prompts(model_name: str, clean: str, corrupted: str):
    """Both prompts tokenized once, for every computation of the page (each checked: not empty, at most the
    page's ``circuits.MAX_PAGE_TOKENS``)."""
    model = get_model(model_name)
    prompts = prompt(model, clean, "clean prompt"), prompt(model, corrupted, "corrupted prompt")
    for encoded, what in zip(prompts, ("clean prompt", "corrupted prompt")):
        circuits.check_prompt(model, encoded, what)
    return prompts


def circuit_attribution(model_name: str, clean, answer: str, foil: str):
    """``mha_core.logit_attribution`` at the last position of the ``clean`` prompt (``circuit_prompts``), cached."""
    model = get_model(model_name)
    return compute(Attribution(model.name, clean, answer, foil), model)


def _patching(model_name: str, clean, corrupted, answer: str, foil: str, *, method: str) -> Patching:
    return Patching(model_key(model_name), clean, corrupted, answer, foil, method=method, exact_top=circuits.EXACT_TOP)


def circuit_patching_ready(model_name: str, clean, corrupted, answer: str, foil: str, *, method: str) -> bool:
    """True when ``circuit_patching``'s value for these inputs is in the server's cache."""
    return ready(_patching(model_name, clean, corrupted, answer, foil, method=method))


def circuit_patching(model_name: str, clean, corrupted, answer: str, foil: str, method: str):
    """``mha_core.patch`` over heads (exact, or attribution with the exact scores of its top heads), cached."""
    return compute(_patching(model_name, clean, corrupted, answer, foil, method=method), get_model(model_name))


def circuit_lens(model_name: str, clean, k: int = circuits.LENS_TOP_K):
    """``mha_core.logit_lens`` of the ``clean`` prompt (``circuit_prompts``), cached."""
    model = get_model(model_name)
    return compute(LogitLens(model.name, clean, k), model)
