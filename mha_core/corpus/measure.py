"""One shard measured: tokenized, run in padded batches of similar lengths, each batch measured at once
(``compute_shard``: a function of the model and the shard alone, so any executor computes it the same way)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.metrics import batch_head_metrics
from ..analysis.syntax import DependencyAccumulator, Sentence, batch_word_argmax, words_of_units
from ..errors import HeadscopeError
from ..models.capture import AttentionBuffer
from ..progress import Progress, report
from ..run import punctuation_mask, token_units, word_level_attentions
from .parts import MetricTotals, ProfilePart
from .reading import model_input, text_length
from .shards import Shard, check_profile_settings

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel


# ---- profiling ----------------------------------------------------------------------------
@dataclass
class _TokenInfo:
    """What profiling needs of one tokenized sentence besides its attentions."""

    special_mask: np.ndarray
    punctuation_mask: np.ndarray
    segment_ids: np.ndarray
    word_ids: np.ndarray
    num_words: int

    @classmethod
    def of_run(cls, run) -> _TokenInfo:
        return cls(run.special_mask, run.punctuation_mask, run.segment_ids, run.word_ids, len(run.words))


def _padded(rows: Sequence[np.ndarray], width: int, fill) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=np.asarray(rows[0]).dtype)
    for row, values in enumerate(rows):
        out[row, : len(values)] = values
    return out


def _forward_batches(model, inputs: list, batch_size: int):
    """Yield ``(sentence indices, attentions [B, L, H, n, n] with zero padding, token infos, is_causal)``.

    Sentences of similar lengths share a batch, to keep padding small: the same batches as ``run_batch``.
    """
    if not hasattr(model, "forward_encoded"):  # a model that only gives runs
        order = sorted(range(len(inputs)), key=lambda i: text_length(inputs[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            runs = model.run_batch([inputs[i] for i in chunk], batch_size=batch_size)
            width = max(run.num_tokens for run in runs)
            attentions = np.zeros((len(runs), *runs[0].attentions.shape[:2], width, width), dtype=np.float32)
            for row, run in enumerate(runs):
                attentions[row, :, :, : run.num_tokens, : run.num_tokens] = run.attentions
            yield chunk, attentions, [_TokenInfo.of_run(run) for run in runs], runs[0].is_causal
        return
    # Tokenized once; one padded forward pass per batch; no per-sentence run objects. Each batch's
    # attentions are measured and dropped before the next pass, so every pass reuses the same memory.
    buffer = AttentionBuffer()
    encoded = [model.encode(model_input) for model_input in inputs]
    order = sorted(range(len(inputs)), key=lambda i: len(encoded[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        attentions, _ = model.forward_encoded([encoded[i] for i in chunk], out=buffer)
        infos = [
            _TokenInfo(
                e.special_mask,
                punctuation_mask(model.display.display(e.raw_tokens), e.special_mask),
                e.segment_ids,
                e.word_ids,
                len(e.words),
            )
            for e in (encoded[i] for i in chunk)
        ]
        yield chunk, attentions.numpy(), infos, model.is_causal


def _word_predictions(
    attentions: np.ndarray, infos: list[_TokenInfo], sentences: list[Sentence]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Clark et al. word-level argmax for a padded batch at once: each sentence's ``(prediction [L, H, W],
    has_word [W])`` (``syntax.word_argmax``).

    Only word units are converted to word level: special units are never predicted nor scored, so their
    rows and columns would be computed only to be excluded (the word units keep their order, so every
    argmax and its ties are the same).
    """
    word_unit_of_token, unit_words = [], []
    for info in infos:
        unit_of_token, first = token_units(info.word_ids, info.special_mask, info.segment_ids)
        is_word = ~info.special_mask[first] & (info.word_ids[first] >= 0)
        word_unit = np.where(is_word, np.cumsum(is_word) - 1, -1)  # each unit's index among the word units
        word_unit_of_token.append(word_unit[unit_of_token])
        unit_words.append(info.word_ids[first][is_word])
    num_units = max(len(unit_word) for unit_word in unit_words)
    if num_units == 0:
        unit_words = [np.zeros(0, dtype=np.int64) for _ in infos]
        best_word = np.zeros((len(infos), *attentions.shape[1:3], 0), dtype=np.int64)
    else:
        word_attentions = word_level_attentions(
            attentions, _padded(word_unit_of_token, attentions.shape[-1], -1), num_units
        )
        best_word = batch_word_argmax(word_attentions, _padded(unit_words, num_units, -1), overwrite=True)
    predictions, has_words = [], []
    for row, (info, unit_word, sentence) in enumerate(zip(infos, unit_words, sentences)):
        if info.num_words != len(sentence.words):
            raise HeadscopeError(
                f"sentence {sentence.sent_id!r}: the run has {info.num_words} words, the tree {len(sentence.words)}; "
                "run the model on the sentence's words (model.run(sentence.words))"
            )
        prediction, has_word = words_of_units(best_word[row, ..., : len(unit_word)], unit_word, info.num_words)
        predictions.append(prediction)
        has_words.append(has_word)
    return predictions, has_words


def word_predictions(
    model: LoadedModel, sentences: Sequence[Sentence], batch_size: int = 16
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every head's word-level argmax on each sentence, in the sentences' order: ``(predictions [L, H, W],
    has_words [W])`` as ``syntax.word_argmax`` gives them, from the profile's padded batches (what
    ``roles.shuffled_tree_tests`` reuses across shuffles)."""
    check_profile_settings(batch_size=batch_size)
    sentences = list(sentences)
    predictions: list = [None] * len(sentences)
    has_words: list = [None] * len(sentences)
    inputs = [model_input(sentence) for sentence in sentences]
    for chunk, attentions, infos, _ in _forward_batches(model, inputs, batch_size):
        batch = _word_predictions(attentions, infos, [sentences[i] for i in chunk])
        for index, prediction, has_word in zip(chunk, *batch):
            predictions[index], has_words[index] = prediction, has_word
    return predictions, has_words


# A batch is measured in parts when that spares at least this many attention weights of padding
# (each part costs a fixed ~2 ms of numpy calls; a weight about 7 ns).
MEASURE_SPLIT_MIN_SAVING = 400_000


def _measured_parts(lengths: Sequence[int], weights_per_token_pair: int) -> list[np.ndarray]:
    """Rows of a padded batch grouped for measuring: one group, or the shorter rows apart from the longest
    when the batch's longest text would make most of their weights padding (e.g. a last batch of a few long
    texts). Groups hold rows in length order; measuring a group trimmed to its own longest text gives each
    row the same values (within float rounding) as measuring the whole padded batch."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    sorted_lengths = np.asarray(lengths)[order]
    width = int(sorted_lengths[-1])
    best_saving, best_cut = 0, 0
    for cut in range(1, len(order)):
        if sorted_lengths[cut - 1] < width:
            saving = cut * (width * width - int(sorted_lengths[cut - 1]) ** 2) * weights_per_token_pair
            if saving > best_saving:
                best_saving, best_cut = saving, cut
    if best_saving < MEASURE_SPLIT_MIN_SAVING:
        return [np.arange(len(order))]
    return [*_regrouped(order[:best_cut], sorted_lengths[:best_cut], weights_per_token_pair), order[best_cut:]]


def _regrouped(rows: np.ndarray, lengths: np.ndarray, weights_per_token_pair: int) -> list[np.ndarray]:
    return [rows[part] for part in _measured_parts(lengths, weights_per_token_pair)]


def compute_shard(
    model: LoadedModel, shard: Shard, batch_size: int = 16, progress: Progress | None = None
) -> ProfilePart:
    """Measure one shard: a function of the model, the shard's sentences and ``batch_size`` alone.

    The shard's sentences are tokenized, run in padded batches of similar lengths and each batch is
    measured at once (``batch_head_metrics``, batched word-level argmax); the part's means equal the
    means of ``head_metrics`` and ``dependency_scores`` of the single runs. ``progress(done, total,
    message)`` counts the shard's sentences.
    """
    check_profile_settings(batch_size=batch_size)
    if not len(shard):
        raise HeadscopeError(f"shard {shard.index} holds no sentences")
    sentences = list(shard.sentences)
    inputs = [model_input(sentence) for sentence in sentences]
    accumulator = DependencyAccumulator() if all(isinstance(s, Sentence) for s in sentences) else None
    order: list[int] = []
    per_batch: list[dict[str, np.ndarray]] = []
    for chunk, attentions, infos, is_causal in _forward_batches(model, inputs, batch_size):
        num_layers, num_heads = attentions.shape[1:3]
        lengths = [len(info.special_mask) for info in infos]
        for rows in _measured_parts(lengths, num_layers * num_heads):
            width = max(lengths[row] for row in rows)
            if len(rows) == len(infos) and width == attentions.shape[-1]:
                part, part_infos = attentions, infos
            else:
                part = np.ascontiguousarray(attentions[rows, :, :, :width, :width])
                part_infos = [infos[row] for row in rows]
            per_batch.append(
                batch_head_metrics(
                    part,
                    _padded([info.special_mask for info in part_infos], width, False),
                    _padded([info.punctuation_mask for info in part_infos], width, False),
                    _padded([info.segment_ids for info in part_infos], width, -1),
                    is_causal,
                )
            )
            if accumulator is not None:
                measured = [sentences[chunk[row]] for row in rows]
                accumulator.add_predictions(*_word_predictions(part, part_infos, measured), measured)
            order.extend(chunk[row] for row in rows)
        report(progress, len(order), len(sentences), "sentences profiled")
    in_sentence_order = np.argsort(order)
    columns = {name: np.concatenate([batch[name] for batch in per_batch])[in_sentence_order] for name in per_batch[0]}
    return ProfilePart(shard.start, num_layers, num_heads, MetricTotals.of_sentences(columns), accumulator)
