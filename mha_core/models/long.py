"""Long runs: every head of a document up to the model's own context length, exact at every zoom.

``run_long(model, text)`` makes a ``LongRun``: the from-scratch engine's pass with the blockwise kernel
(``mha_core.engine.blockwise``), which keeps per layer the queries and keys as the scores see them and each
row's log-sum-exp, never the ``[n, n]`` weights. During the pass it pools every head's overview at
``overview_size`` cells a side (mean and max) and streams the head metrics and long-context statistics
(``mha_core.analysis.streamed``); afterwards any block is exact on demand (``attention_block``) and any region
can be pooled again from exact blocks (``attention_overview``). Memory grows with n: the operation that runs it
(``mha_core.operations.long.LongAttention.peak_bytes``) says how much before a run starts, so that a budget can
reserve it.

Where the limit binds: decoders run to their own context length (SmolLM2: 8,192 tokens; GPT-2: 1,024), encoders
to their learned positions (MiniLM, BERT: 512; MPNet: 512) or their tokenizer's limit, whichever is smaller
(``LoadedModel.context_length``). The short dense path (``model.run``) stays capped at ``MAX_TOKENS_CAP``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analysis.long_roles import generated_copies, local_windows, long_roles, needle_copies, sink_by_distance
from ..analysis.streamed import RowStatistics
from ..engine.blockwise import BLOCK_BYTES, CHUNK, Block, BlockwiseAttention, LayerScores, as_positions
from ..engine.core import core_attentions, core_family, core_model
from ..errors import InputTextError
from ..pooling import PooledGrid, bin_edges, check_reduce
from ..progress import Progress, progress_part, report
from ..run import punctuation_mask
from ..views import standalone
from .tokens import EncodedText

OVERVIEW_SIZE = 128  # cells a side of every head's overview, pooled during the pass
LONG_DOCUMENTS = Path(__file__).resolve().parents[2] / "assets" / "long" / "documents.json"  # UD EWT dev, CC BY-SA
# The needle-in-a-haystack test's default needle and question (Wu et al. 2024's form: the question ends with the
# needle's own words, and the model writes the rest).
NEEDLE = "The secret password for the garden gate is purple elephant nineteen."
NEEDLE_QUESTION = "What is the secret password for the garden gate? The secret password for the garden gate is"


@dataclass
class LongRun:
    """One document's attention, every layer and head, kept as what makes the weights (``LayerScores``).

    tokens, raw_tokens, special_mask, word_ids, words, segment_ids, token_ids: as in ``AttentionRun``
    layers           one ``LayerScores`` per layer
    overview_mean    float32 ``[layers, heads, S, S]``: each head pooled to S x S cells by mean during the pass
    overview_max     the same by max
    statistics       ``RowStatistics``: per-row values of every head (the streamed metrics and long roles)
    hidden           the residual stream after the last layer ``[n, d]`` when asked for (``keep_hidden``)
    truncated        True when the document was cut to what the model reads (``long_run_limit``) before the run;
                     ``num_input_tokens`` is its full length and ``metadata["cut"]`` says so in a sentence
    """

    model_name: str
    family: str
    is_causal: bool
    tokens: list[str]
    raw_tokens: list[str]
    special_mask: np.ndarray
    word_ids: np.ndarray
    words: list[str]
    segment_ids: np.ndarray
    token_ids: list[int]
    text: str
    layers: list[LayerScores]
    overview_mean: np.ndarray
    overview_max: np.ndarray
    statistics: RowStatistics
    truncated: bool = False
    num_input_tokens: int = 0
    hidden: torch.Tensor | None = None
    metadata: dict = field(default_factory=dict)
    _metrics: pd.DataFrame | None = field(default=None, repr=False)

    # ---- shape -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.layers[0].query.shape[0]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def overview_size(self) -> int:
        return self.overview_mean.shape[-1]

    @property
    def stored_bytes(self) -> int:
        """Bytes this run holds: queries, keys, log-sum-exps, overviews, row statistics (all grow with n)."""
        arrays = (self.overview_mean, self.overview_max)
        return sum(layer.nbytes for layer in self.layers) + sum(a.nbytes for a in arrays) + self.statistics.nbytes

    def summary(self) -> str:
        trunc = f", truncated from {self.num_input_tokens}" if self.truncated else ""
        return (
            f"{self.model_name} ({self.family}{', causal' if self.is_causal else ''}): {self.num_layers} layers x "
            f"{self.num_heads} heads, {self.num_tokens} tokens{trunc}, long run ({self.stored_bytes / 2**20:.0f} MB)"
        )

    def to_html(self, path: str | Path | None = None, **options):
        """The deep zoom of ``layer``, ``head`` (or ``view="model"``: every head) as one self-contained HTML page: its
        text, or written to ``path`` (returned). A file holds the whole document's view as it opens; a notebook's
        ``mc.show`` zooms further (the kernel pools the region asked for)."""
        return standalone.to_html(self, path, **options)

    def _check_head(self, layer: int, head: int) -> None:
        if not (0 <= layer < self.num_layers and 0 <= head < self.num_heads):
            raise ValueError(
                f"no head ({layer}, {head}): layers 0..{self.num_layers - 1}, heads 0..{self.num_heads - 1}"
            )

    # ---- exact weights ---------------------------------------------------------------------
    def attention_block(self, layer: int, head: int, rows, cols) -> np.ndarray:
        """float32 ``[len(rows), len(cols)]``: the head's exact weights there (rows, cols: slices, ranges,
        ``(start, stop)`` pairs or position lists), equal to the dense path's ``attentions[layer, head]``."""
        self._check_head(layer, head)
        with torch.inference_mode():
            return self.layers[layer].weights([head], rows, cols)[0].numpy()

    def attention_overview(
        self, layer: int, head: int, size: int | None = None, reduce: str = "mean", rows=None, cols=None
    ) -> np.ndarray:
        """The head's region ``rows x cols`` (``(start, stop)`` pairs; default: everything) pooled to at most
        ``size`` cells a side by ``reduce`` ("mean" or "max") of the exact weights; ``bin_edges`` gives the cells'
        token edges. The whole head at ``overview_size`` was pooled during the pass; any other region or size is
        pooled now from exact blocks."""
        self._check_head(layer, head)
        check_reduce(reduce)
        n = self.num_tokens
        size = self.overview_size if size is None else int(size)
        rows, cols = _region(rows, n, "rows"), _region(cols, n, "cols")
        if rows == (0, n) and cols == (0, n) and size == self.overview_size:
            return (self.overview_mean if reduce == "mean" else self.overview_max)[layer, head].copy()
        grid = PooledGrid(1, rows, cols, size)
        width = cols[1] - cols[0]
        step = max(1, (BLOCK_BYTES // 4) // width)
        with torch.inference_mode():
            for start in range(rows[0], rows[1], step):
                stop = min(rows[1], start + step)
                grid.add(start, self.layers[layer].weights([head], (start, stop), cols))
        return grid.result(reduce)[0]

    def model_overview(self, size: int, reduce: str = "mean") -> np.ndarray:
        """Every head at ``size`` cells a side, ``[layers, heads, size', size']`` float32 (``size' = min(size, n)``):
        merged from the overviews pooled during the pass when their cells nest in these (exact: a mean
        weighted by the cells' areas, a max of maxima), else pooled again from exact blocks."""
        check_reduce(reduce)
        n, stored = self.num_tokens, self.overview_size
        if stored % size == 0 and stored < n and size < stored:
            factor = stored // size
            edges = bin_edges(0, n, stored)
            shape = (self.num_layers, self.num_heads, size, factor, size, factor)
            if reduce == "max":
                return self.overview_max.reshape(shape).max(axis=(3, 5))
            widths = np.diff(edges)
            area = widths[:, None] * widths[None, :]
            sums = (self.overview_mean.astype(np.float64) * area).reshape(shape).sum(axis=(3, 5))
            coarse = np.diff(bin_edges(0, n, size))
            return (sums / (coarse[:, None] * coarse[None, :])).astype(np.float32)
        return np.stack(
            [
                np.stack([self.attention_overview(layer, head, size, reduce) for head in range(self.num_heads)])
                for layer in range(self.num_layers)
            ]
        )

    # ---- measurements ----------------------------------------------------------------------
    def head_metrics(self) -> pd.DataFrame:
        """``mha_core.head_metrics``' table, from the statistics streamed during the pass."""
        if self._metrics is None:
            self._metrics = self.statistics.finish(self._weights_at_columns)
        return self._metrics.copy()

    def _weights_at_columns(self, layer: int, cols: np.ndarray) -> np.ndarray:
        """``[heads, n, k]``: every head's exact weights at its own ``k`` key columns ``cols [heads, k]`` (one
        block of the columns they ask for together)."""
        wanted = np.unique(cols)
        with torch.inference_mode():
            block = self.layers[layer].weights(np.arange(self.num_heads), (0, self.num_tokens), wanted).numpy()
        return np.take_along_axis(block, np.searchsorted(wanted, cols)[:, None, :], axis=2)

    def roles(self, copies=None) -> pd.DataFrame:
        """Long-context roles (``mha_core.analysis.long_roles``): sink at length and local heads always,
        retrieval heads when ``copies`` (``needle_copies``) say which tokens the text copies."""
        return long_roles(self.statistics, copies)

    def sink_by_distance(self, band: int = 512) -> pd.DataFrame:
        edges = list(range(0, self.num_tokens, band)) + [self.num_tokens]
        return sink_by_distance(self.statistics.rows["first_tokens"], self.statistics.rows["total"], edges)

    def local_windows(self) -> pd.DataFrame:
        return local_windows(self.statistics.rows["window"], self.is_causal)


def _region(region, n: int, what: str) -> tuple[int, int]:
    if region is None:
        return (0, n)
    positions = as_positions(region, n, what)
    if positions.numel() == 0:
        raise ValueError(f"{what} is an empty region")
    return int(positions[0]), int(positions[-1]) + 1


def long_run_limit(model) -> int:
    """The most tokens a long run of ``model`` reads: its ``context_length``, and never more than the positions
    its from-scratch engine has (learned positions are a table of that many rows)."""
    positions = core_model(model.hf_model).max_positions
    return int(model.context_length if positions is None else min(model.context_length, positions))


# What a long run says when it cut a document (``cut_notice``), and why a model reads no more (by ``is_causal``):
# the app says the same words through its catalog.
CUT_NOTICE = (
    "The document has {total} tokens; {model} reads at most {kept} ({why}), so its first {kept} tokens were read."
)
CUT_REASONS = {True: "its context length", False: "its learned positions"}


def cut_notice(model, num_input_tokens: int, kept: int) -> str:
    """What a long run says when it read only the first ``kept`` of ``num_input_tokens`` tokens."""
    why = CUT_REASONS[bool(model.is_causal)]
    return CUT_NOTICE.format(total=f"{int(num_input_tokens):,}", model=model.name, kept=f"{kept:,}", why=why)


def _core_pass(model, input_ids: torch.Tensor, token_type_ids, kernel: BlockwiseAttention, keep_hidden: bool):
    """The one call into the model's engine: the from-scratch pass with ``kernel`` in every layer's attention."""
    outputs: dict = {}
    kernel.run(
        core_attentions,
        model.hf_model,
        input_ids,
        token_type_ids=token_type_ids,
        outputs=outputs if keep_hidden else None,
    )
    return outputs.get("hidden")


def run_long(
    model,
    text: str | None = None,
    token_ids=None,
    progress: Progress | None = None,
    overview_size: int = OVERVIEW_SIZE,
    bos: bool | None = None,
    keep_hidden: bool = False,
) -> LongRun:
    """Every head of ``text`` (or of ``token_ids``, taken as is) up to ``model.context_length`` tokens, as a
    ``LongRun``. ``progress(done, total, message)`` after every block of rows (total: the number of layers);
    it may raise to stop the run. Needs a model the from-scratch engine recomputes (``EngineNotSupported``
    says why not)."""
    core_family(model.hf_model)  # EngineNotSupported before any work
    if (text is None) == (token_ids is None):
        raise InputTextError("Give a text or token ids (one of them).")
    limit = long_run_limit(model)  # cut before the run: the engine refuses more than its positions
    encoded: EncodedText = (
        model.encode_long(text, bos, max_tokens=limit)
        if text is not None
        else model.encode_long_ids(token_ids, max_tokens=limit)
    )
    n = len(encoded.input_ids)
    tokens = model.display.display(encoded.raw_tokens, encoded.word_ids)
    statistics = RowStatistics(
        model.num_layers,
        model.num_heads,
        special_mask=encoded.special_mask,
        segment_ids=encoded.segment_ids,
        punctuation_mask=punctuation_mask(tokens, encoded.special_mask),
        is_causal=model.is_causal,
    )
    grids: list[PooledGrid] = []

    class Overviews:  # pools each layer's blocks; a new grid when a layer begins
        @staticmethod
        def add(block: Block) -> None:
            if block.layer == len(grids):
                grids.append(PooledGrid(model.num_heads, (0, n), (0, n), overview_size))
            grids[block.layer].add(block.row_start, block.weights, block.chunks, CHUNK)

    kernel = BlockwiseAttention(
        model.num_layers, (Overviews, statistics), progress, statistics.key_features, score_sums=True
    )
    input_ids = torch.tensor([encoded.input_ids])
    token_type_ids = torch.tensor([encoded.token_type_ids]) if encoded.token_type_ids is not None else None
    with torch.inference_mode():
        hidden = _core_pass(model, input_ids, token_type_ids, kernel, keep_hidden)
    statistics.end_pass()
    return LongRun(
        model_name=model.name,
        family=model.family,
        is_causal=model.is_causal,
        tokens=tokens,
        raw_tokens=list(encoded.raw_tokens),
        special_mask=np.asarray(encoded.special_mask, dtype=bool),
        word_ids=np.asarray(encoded.word_ids),
        words=list(encoded.words),
        segment_ids=np.asarray(encoded.segment_ids),
        token_ids=list(encoded.input_ids),
        text=encoded.text,
        layers=kernel.layers,
        overview_mean=np.stack([grid.result("mean") for grid in grids]),
        overview_max=np.stack([grid.result("max") for grid in grids]),
        statistics=statistics,
        truncated=encoded.truncated,
        num_input_tokens=encoded.num_input_tokens,
        hidden=None if hidden is None else hidden[0],
        metadata={
            "context_length": model.context_length,
            "overview_size": overview_size,
            **({"cut": cut_notice(model, encoded.num_input_tokens, n)} if encoded.truncated else {}),
        },
    )


def run_document(model, text: str, progress: Progress | None = None, engine: str = "core"):
    """The dense ``AttentionRun`` when the text fits the dense path (``model.max_tokens``, at most
    ``MAX_TOKENS_CAP``), a ``LongRun`` above it; both answer ``attention_block`` and ``attention_overview``."""
    if len(model.encode_long(text).input_ids) <= model.max_tokens:
        return model.run(text, engine=engine, progress=progress)
    return run_long(model, text, progress=progress)


@cache
def long_documents() -> tuple[dict, ...]:
    """The long examples shipped in ``assets/long/documents.json`` (consecutive UD English EWT dev documents,
    CC BY-SA 4.0): ``label``, ``documents``, ``text``, shortest first."""
    return tuple(json.loads(LONG_DOCUMENTS.read_text(encoding="utf-8")))


def haystack() -> str:
    """Every long example, the longest first: more text than any model's context (SmolLM2: 8,192 tokens)."""
    return "\n\n".join(document["text"] for document in long_documents()[::-1])


# The needle test's answer: at most the needle's length plus this many tokens, ended by the model's end of text, a
# new line or a token that ends a sentence.
ANSWER_EXTRA_TOKENS = 4
# Rows of the prompt read at once while the model answers (the key-value cache is filled a block at a time, so the
# eager attention of a block, heads x rows x keys, stays small at 8,192 tokens).
ANSWER_PREFILL_ROWS = 256


@dataclass(frozen=True)
class NeedlePrompt:
    """A needle-in-a-haystack prompt (Wu et al. 2024) as token ids: the haystack with the needle at a depth, then
    the question, which the model answers (``run_needle``). ``needle_start``, ``needle_length``: where the
    needle's tokens are; ``answer_tokens``: at most this many tokens of answer fit the length asked for."""

    token_ids: tuple[int, ...]
    needle_start: int
    needle_length: int
    answer_tokens: int

    def teacher_forced(self) -> tuple[list[int], list[tuple[int, int]]]:
        """The prompt with the needle repeated as its answer, and that answer's copies (``needle_copies``): a fixed
        input of the full length (bench/long.py times the long pass on it). Its retrieval scores are not Wu et
        al.'s: after the first answer token, repeating a sequence seen before is an induction task."""
        needle = list(self.token_ids[self.needle_start : self.needle_start + self.needle_length])
        ids = [*self.token_ids, *needle]
        return ids, needle_copies(ids, self.needle_start, len(self.token_ids), self.needle_length)


def needle_question(
    model,
    haystack: str,
    needle: str,
    question: str,
    depth: float = 0.5,
    num_tokens: int | None = None,
    answer_tokens: int | None = None,
) -> NeedlePrompt:
    """A ``NeedlePrompt``: ``haystack`` cut so that the prompt and an answer of ``answer_tokens`` (default: the
    needle's length and ``ANSWER_EXTRA_TOKENS``) fit ``num_tokens`` (default: the model's context length),
    ``needle`` inserted at ``depth`` (0 = start, 1 = end, at a token boundary), then ``question``. Tokenizer only:
    no pass."""
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must lie in 0..1 (0 = the start, 1 = the end), got {depth}")
    if not needle.strip() or not question.strip():
        raise InputTextError("Give a needle sentence and a question about it.")
    tokenizer = model.tokenizer
    encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    needle_ids, question_ids, hay_ids = encode(" " + needle.strip()), encode(" " + question.strip()), encode(haystack)
    bos = [tokenizer.bos_token_id] if model.default_bos else []
    answer_tokens = len(needle_ids) + ANSWER_EXTRA_TOKENS if answer_tokens is None else int(answer_tokens)
    budget = (num_tokens or model.context_length) - len(bos) - len(needle_ids) - len(question_ids) - answer_tokens
    if budget < 1:
        raise InputTextError("The needle and question leave no room for a haystack at this length.")
    hay_ids = hay_ids[:budget]
    cut = round(depth * len(hay_ids))
    ids = bos + hay_ids[:cut] + needle_ids + hay_ids[cut:] + question_ids
    return NeedlePrompt(tuple(ids), len(bos) + cut, len(needle_ids), answer_tokens)


def needle_prompt(model, haystack: str, needle: str, question: str, depth: float = 0.5, num_tokens: int | None = None):
    """``needle_question``'s prompt with the needle repeated as a teacher-forced answer (``NeedlePrompt.
    teacher_forced``): ``(token_ids, copies)``, ``num_tokens`` long in all. A fixed input for timing; the needle
    test is ``run_needle``."""
    needle_length = len(model.tokenizer(" " + needle.strip(), add_special_tokens=False)["input_ids"])
    prompt = needle_question(
        model, haystack, needle, question, depth=depth, num_tokens=num_tokens, answer_tokens=needle_length
    )
    return prompt.teacher_forced()


@dataclass(frozen=True)
class NeedleAnswer:
    """What the model answered in a needle test (``run_needle``): ``answer_ids`` (greedy, its own), ``answer``
    (their text), ``answer_start`` (the answer's first position in the run), ``copies`` (``generated_copies``:
    the answer's tokens that are in the needle, what its retrieval heads are scored on) and the needle's place."""

    answer_ids: tuple[int, ...]
    answer: str
    answer_start: int
    needle_start: int
    needle_length: int
    copies: tuple[tuple[int, int], ...]


def _ends_answer(text: str) -> bool:
    stripped = text.rstrip(" ")
    return "\n" in text or stripped.endswith((".", "!", "?"))


def greedy_answer(model, token_ids, max_new_tokens: int, progress: Progress | None = None) -> list[int]:
    """The model's own greedy continuation of ``token_ids`` (a decoder with its language-model head), up to
    ``max_new_tokens`` tokens, ended by its end-of-text token, a new line or a token that ends a sentence. The
    checkpoint's own layers (eager attention) with a key-value cache, filled ``ANSWER_PREFILL_ROWS`` rows at a
    time, then one token per step; ``progress`` counts the prompt's blocks and the steps."""
    from transformers import DynamicCache  # transformers: imported on first use, as in models.loading

    if not model.is_causal or not model.has_lm_head:
        raise InputTextError(f"{model.name} does not write text: a needle test needs a decoder with its head.")
    ids = [int(i) for i in token_ids]
    blocks = list(range(0, len(ids), ANSWER_PREFILL_ROWS))
    total = len(blocks) + max_new_tokens
    cache = DynamicCache()
    answer: list[int] = []
    with model.forward_lock, torch.inference_mode():
        for index, start in enumerate(blocks):
            chunk = torch.tensor([ids[start : start + ANSWER_PREFILL_ROWS]])
            hidden = model.hf_model(input_ids=chunk, past_key_values=cache, use_cache=True).last_hidden_state
            report(progress, index + 1, total, "reading the prompt")
        for step in range(max_new_tokens):
            token = int(model.logits(hidden[0, -1]).argmax())
            answer.append(token)
            report(progress, len(blocks) + step + 1, total, "answering")
            if token == model.tokenizer.eos_token_id or _ends_answer(model.tokenizer.decode([token])):
                break
            hidden = model.hf_model(
                input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True
            ).last_hidden_state
    return answer


def run_needle(model, prompt: NeedlePrompt, progress: Progress | None = None) -> LongRun:
    """The needle test of Wu et al. (2024): the model answers ``prompt`` greedily (``greedy_answer``), then the long
    path reads the prompt and the answer (``run_long``), so every head's attention while it wrote each answer
    token is in the run (a decoder's row depends only on the tokens before it). The long path's own greedy choice
    is checked on every answer row; the answer is kept up to the first row where the two engines' argmax differ
    (float rounding; it never did on SmolLM2). ``run.metadata["needle"]`` is the ``NeedleAnswer``, whose
    ``copies`` score the retrieval heads: ``run.roles(answer.copies)``."""
    answer = greedy_answer(model, prompt.token_ids, prompt.answer_tokens, progress_part(progress, 0, 2))
    ids = [*prompt.token_ids, *answer]
    run = run_long(model, token_ids=ids, progress=progress_part(progress, 1, 2), keep_hidden=True)
    start = len(prompt.token_ids)
    stack = model.modules.stacks["blocks"] if model.modules is not None else None
    final_norm = stack.final_norm if stack is not None else None
    with torch.inference_mode():
        rows = run.hidden[start - 1 : len(ids) - 1]
        chosen = model.logits(final_norm(rows) if final_norm is not None else rows).argmax(-1).tolist()
    agreed = next((i for i, (a, b) in enumerate(zip(chosen, answer)) if a != b), len(answer))
    kept = ids[: start + agreed]
    run.hidden = None  # the check is done: the run keeps no [n, d] states
    run.metadata["needle"] = NeedleAnswer(
        answer_ids=tuple(answer[:agreed]),
        answer=model.tokenizer.decode(answer[:agreed]),
        answer_start=start,
        needle_start=prompt.needle_start,
        needle_length=prompt.needle_length,
        copies=tuple(generated_copies(kept, prompt.needle_start, prompt.needle_length, start)),
    )
    return run
