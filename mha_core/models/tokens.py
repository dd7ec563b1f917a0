"""Display text for tokenizer pieces, and the mapping from tokens to words.

Tokenizers mark word boundaries in their pieces: WordPiece prefixes a continuation with ``##``,
byte-level BPE (GPT-2, SmolLM2) writes a leading space as ``Ġ`` and a newline as ``Ċ``,
SentencePiece writes a space as ``▁`` and unknown bytes as ``<0x0A>``. Views show the
readable text instead; the raw pieces stay in ``AttentionRun.raw_tokens``.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import EmptyTextError, InputTextError, quoted

# How a piece that continues the word before it is shown, for every tokenizer alike.
CONTINUATION = "##"
# Whitespace-only pieces would be invisible in a heatmap axis; show a symbol for each character (a no-break space
# as the symbol made for it; any other white space, e.g. a thin or ideographic space, as an open box).
WHITESPACE_SYMBOLS = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\xa0": "⍽"}
OTHER_WHITESPACE_SYMBOL = "␣"
_SENTENCEPIECE_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: the printable character standing for each byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shift)
            shift += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


def visible(text: str) -> str:
    """Strip the word-boundary whitespace; a piece that is only whitespace becomes symbols (``⏎``, ``␣``)."""
    stripped = text.strip()
    if stripped:
        return stripped
    return "".join(WHITESPACE_SYMBOLS.get(ch, OTHER_WHITESPACE_SYMBOL if ch.isspace() else ch) for ch in text)


class TokenDisplay:
    """Turns a tokenizer's raw pieces into readable text, per the tokenizer's own marking scheme."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        model_kind = type(backend.model).__name__ if backend is not None else ""
        self.subword_prefix = (
            getattr(backend.model, "continuing_subword_prefix", None) if model_kind == "WordPiece" else None
        )
        described = " ".join(
            repr(part) for part in (getattr(backend, "decoder", None), getattr(backend, "pre_tokenizer", None))
        )
        self.byte_level = "ByteLevel" in described
        self.special_tokens = set(getattr(tokenizer, "all_special_tokens", []))
        self._cache: dict[str, str] = {}

    def __call__(self, raw: str) -> str:
        shown = self._cache.get(raw)
        if shown is None:
            shown = self._cache[raw] = raw if raw in self.special_tokens else visible(self._decode(raw))
        return shown

    def _decode(self, raw: str) -> str:
        if self.subword_prefix and raw.startswith(self.subword_prefix) and len(raw) > len(self.subword_prefix):
            return raw[len(self.subword_prefix) :]
        if self.byte_level:
            decoder = byte_level_decoder()
            if all(ch in decoder for ch in raw):
                # A piece can hold part of a multi-byte character; show those bytes escaped.
                return bytes(decoder[ch] for ch in raw).decode("utf-8", errors="backslashreplace")
        byte = _SENTENCEPIECE_BYTE.match(raw)
        if byte:
            return bytes([int(byte.group(1), 16)]).decode("utf-8", errors="backslashreplace")
        return raw.replace("▁", " ")

    def display(self, raw_tokens: list[str], word_ids=None) -> list[str]:
        """Readable text of each piece; with ``word_ids``, a piece that continues the word before it is
        shown as ``##piece`` whatever the tokenizer's own marking (WordPiece ``##``, byte-level BPE's
        missing ``Ġ``, SentencePiece's missing ``▁``), so "unbelievably" reads "un ##bel ##iev ##ably"."""
        shown = [self(raw) for raw in raw_tokens]
        if word_ids is not None:
            for i in range(1, len(shown)):
                if word_ids[i] >= 0 and word_ids[i] == word_ids[i - 1]:
                    shown[i] = CONTINUATION + shown[i]
        return shown


def words_from_offsets(word_spans: list[tuple[int, int]], offsets, special_mask) -> np.ndarray:
    """Index of the word each token belongs to (-1 for special tokens), from character offsets.

    ``word_spans`` are the ``(start, end)`` character spans of the words in the tokenized text.
    A token belongs to the first word its characters overlap (a byte-level piece's span may
    include the space before its word).
    """
    starts = np.array([span[0] for span in word_spans], dtype=np.int64)
    ends = np.array([span[1] for span in word_spans], dtype=np.int64)
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    token_starts, token_ends = spans[:, 0], spans[:, 1]
    word_ids = np.full(len(spans), -1, dtype=np.int64)
    scored = ~np.asarray(special_mask, dtype=bool) & (token_ends > token_starts)
    if len(starts) and np.all(starts[1:] >= ends[:-1]) and np.all(ends >= starts):
        # Words in order, not overlapping: the first word ending after the token's start is the only
        # candidate for the first overlap (one search for all tokens instead of a scan per token).
        first = np.minimum(np.searchsorted(ends, token_starts, side="right"), len(ends) - 1)
        overlaps = scored & (ends[first] > token_starts) & (starts[first] < token_ends)
        word_ids[overlaps] = first[overlaps]
        pending = np.flatnonzero(scored & ~overlaps)
    else:
        pending = np.flatnonzero(scored)
    for i in pending.tolist():
        overlapping = np.flatnonzero((starts < token_ends[i]) & (ends > token_starts[i]))
        if overlapping.size:
            word_ids[i] = overlapping[0]
        elif i > 0:
            # Only whitespace (e.g. a lone "Ġ" piece): attach to the previous token's word.
            word_ids[i] = word_ids[i - 1]
    return word_ids


@dataclass
class EncodedText:
    """One text, tokenized, with everything a run needs except the attentions."""

    input_ids: list[int]
    token_type_ids: list[int] | None
    raw_tokens: list[str]
    special_mask: np.ndarray
    word_ids: np.ndarray
    words: list[str]
    segment_ids: np.ndarray
    text: str
    text_pair: str | None
    truncated: bool
    num_input_tokens: int
    added_bos: bool = False  # a BOS token was put first by Headscope (``with_bos``), not by the tokenizer

    def __len__(self) -> int:
        return len(self.input_ids)

    def run_fields(self, display: TokenDisplay, **metadata) -> dict:
        """What a run of this text holds besides its attention, as a run's fields: the tokens as ``display`` shows
        them, the pieces, masks, words and segments, the text, whether it was cut, and ``metadata`` with the token
        ids first (``LoadedModel``'s and ``Seq2SeqModel``'s runs alike)."""
        return dict(
            tokens=display.display(self.raw_tokens, self.word_ids),
            raw_tokens=self.raw_tokens,
            special_mask=self.special_mask,
            word_ids=self.word_ids,
            words=self.words,
            segment_ids=self.segment_ids,
            text=self.text,
            text_pair=self.text_pair,
            truncated=self.truncated,
            num_input_tokens=self.num_input_tokens,
            metadata={"token_ids": self.input_ids, **metadata},
        )

    def with_bos(self, bos_id: int, bos_token: str) -> EncodedText:
        """The same text behind a BOS token: a special token of segment 0 that belongs to no word."""
        return dataclasses.replace(
            self,
            input_ids=[bos_id, *self.input_ids],
            token_type_ids=None if self.token_type_ids is None else [0, *self.token_type_ids],
            raw_tokens=[bos_token, *self.raw_tokens],
            special_mask=np.concatenate([[True], self.special_mask]),
            word_ids=np.concatenate([[-1], self.word_ids]),
            segment_ids=np.concatenate([[0], self.segment_ids]),
            added_bos=True,
        )


def check_text(value, what: str) -> str:
    if not isinstance(value, str):
        raise InputTextError(f"The {what} must be a string, got {type(value).__name__}.")
    if value.isascii() and value and not value.isspace():  # ASCII has no invisible format characters
        return value
    if not visible_text(value):
        raise EmptyTextError(f"The {what} is empty: type at least one word.", what)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: e.g. bytes of a command line that are not UTF-8
        raise InputTextError(f"The {what} holds characters that are not valid Unicode text.") from None
    return value


def visible_text(text: str) -> str:
    """``text`` without white space and invisible format characters (zero-width spaces and joiners,
    BOM, direction marks): what is left is what a reader can see. Empty means empty input."""
    return "".join(ch for ch in text if not ch.isspace() and unicodedata.category(ch) != "Cf")


class TextEncoder:
    """Turns text (or pre-split words, or token ids) into ``EncodedText`` for one tokenizer: the
    tokenizer's pieces, special tokens, segments of a sentence pair, and the words the pieces belong to."""

    def __init__(
        self,
        tokenizer,
        display: TokenDisplay,
        max_tokens: int,
        uses_token_types: bool,
        is_causal: bool,
        model_name: str,
    ):
        self.tokenizer = tokenizer
        self.display = display
        self.max_tokens = max_tokens
        self._uses_token_types = uses_token_types
        self.is_causal = is_causal
        self.name = model_name
        self._special_ids = set(tokenizer.all_special_ids)

    @property
    def bos_token_id(self) -> int | None:
        """The token a text may begin with (``<|im_start|>``, ``<s>``, ...), or None."""
        return getattr(self.tokenizer, "bos_token_id", None)

    @property
    def adds_bos(self) -> bool:
        """True when the tokenizer itself begins every text with its BOS token (as Llama 2's does)."""
        bos = self.bos_token_id
        return bos is not None and self.tokenizer("a", verbose=False)["input_ids"][:1] == [bos]

    def _tokenize(self, text: str, text_pair: str | None, limit: int | None):
        return self.tokenizer(
            text,
            text_pair,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_token_type_ids=self._uses_token_types,
            truncation=limit is not None,
            max_length=limit,
            verbose=False,
        )

    def encode(
        self, text_or_words: str | Sequence[str], text_pair: str | None = None, bos: bool = False
    ) -> EncodedText:
        """Tokenize a text (or a list of pre-split words, joined by spaces), truncating to ``max_tokens``.

        ``bos``: begin with the tokenizer's BOS token (a special token of no word), where it has one and
        does not add it itself. Decoders put much of their attention on whatever comes first (an
        "attention sink"); a BOS gives that attention a place that is not a word of the text.

        An ``EncodedText`` is returned as it is (its pair, BOS and cut were decided when it was encoded): a caller
        that tokenized once (``mha_core.operations``) hands it to every function that takes a text.
        """
        if isinstance(text_or_words, EncodedText):
            return text_or_words
        given_words = None
        if isinstance(text_or_words, (list, tuple)):
            if not text_or_words:
                raise InputTextError("The word list is empty: give at least one word.")
            given_words = [check_text(word, "word").strip() for word in text_or_words]
            text = " ".join(given_words)
        else:
            text = check_text(text_or_words, "text")
        if text_pair is not None:
            check_text(text_pair, "pair text")
            if self.is_causal:
                raise InputTextError(
                    f"{self.name} is a decoder (causal) model: sentence pairs need an encoder such as "
                    "minilm or bert-base-uncased. Run the text without a pair."
                )
        bos = bool(bos) and self.bos_token_id is not None and not self.adds_bos
        limit = self.max_tokens - int(bos)
        encoding = self._tokenize(text, text_pair, None)
        num_input_tokens = len(encoding["input_ids"]) + int(bos)
        truncated = num_input_tokens > self.max_tokens
        if truncated:
            encoding = self._tokenize(text, text_pair, limit)
        special_mask = np.asarray(encoding["special_tokens_mask"], dtype=bool)
        sequence_ids = encoding.sequence_ids()
        self._check_tokens_read(special_mask, sequence_ids, text, text_pair)
        segment_ids = np.zeros(len(sequence_ids), dtype=np.int64)
        for i, sequence in enumerate(sequence_ids):
            # Special tokens belong to the segment they close ([SEP] ends the first text).
            segment_ids[i] = sequence if sequence is not None else (segment_ids[i - 1] if i else 0)
        if given_words is not None:
            spans, start = [], 0
            for word in given_words:
                spans.append((start, start + len(word)))
                start += len(word) + 1
            words, word_ids = given_words, words_from_offsets(spans, encoding["offset_mapping"], special_mask)
        else:
            words, word_ids = self._tokenizer_words(encoding, sequence_ids, text, text_pair, special_mask)
        encoded = EncodedText(
            input_ids=list(encoding["input_ids"]),
            token_type_ids=encoding.get("token_type_ids"),
            raw_tokens=encoding.tokens(),
            special_mask=special_mask,
            word_ids=word_ids,
            words=words,
            segment_ids=segment_ids,
            text=text,
            text_pair=text_pair,
            truncated=truncated,
            num_input_tokens=num_input_tokens,
        )
        return encoded.with_bos(self.bos_token_id, self.tokenizer.bos_token) if bos else encoded

    def _check_tokens_read(self, special_mask, sequence_ids, text: str, text_pair: str | None) -> None:
        """``EmptyTextError`` for a text (or pair text) of which the tokenizer kept nothing but its special
        tokens: a tokenizer that drops accents and control characters (BERT's) leaves ``[CLS] [SEP]`` of a
        text of combining marks alone, which no view or measurement can use."""
        for sequence, what, value in ((0, "text", text), (1, "pair text", text_pair)):
            if value is None:
                continue
            if not any(s == sequence and not special for s, special in zip(sequence_ids, special_mask)):
                raise EmptyTextError(
                    f"The {what} {quoted(value, 40)} is empty to this model: its tokenizer drops every character of "
                    "it (accents or marks alone, control characters). Type at least one word.",
                    what,
                )

    @staticmethod
    def _tokenizer_words(
        encoding, sequence_ids, text: str, text_pair: str | None, special_mask
    ) -> tuple[list[str], np.ndarray]:
        """Words as the tokenizer's pre-tokenizer splits them, numbered across both texts of a pair.

        A word's text is the span its tokens' character offsets cover in its own text.
        """
        sources = (text, text_pair)
        spans: list[list[int]] = []  # [sequence, start, end] per word
        index_of: dict[tuple[int, int], int] = {}
        word_ids = np.full(len(special_mask), -1, dtype=np.int64)
        for i, (word, sequence, (start, end)) in enumerate(
            zip(encoding.word_ids(), sequence_ids, encoding["offset_mapping"])
        ):
            if word is None or sequence is None or special_mask[i]:
                continue
            index = index_of.get((sequence, word))
            if index is None:
                index = index_of[(sequence, word)] = len(spans)
                spans.append([sequence, start, end])
            else:
                spans[index][2] = max(spans[index][2], end)
            word_ids[i] = index
        return [visible(sources[sequence][start:end]) for sequence, start, end in spans], word_ids

    def encode_ids(self, token_ids: Sequence[int], vocab_size: int) -> EncodedText:
        """Already-tokenized input, taken as is (no special tokens added), cut to ``max_tokens``."""
        ids = [int(i) for i in np.asarray(token_ids, dtype=np.int64).reshape(-1)]
        if not ids:
            raise InputTextError("No token ids: give at least one.")
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise InputTextError(f"Token ids out of the vocabulary (0..{vocab_size - 1}): {bad[:5]}")
        num_input_tokens = len(ids)
        ids = ids[: self.max_tokens]
        raw_tokens = self.tokenizer.convert_ids_to_tokens(ids)
        special_mask = np.array([i in self._special_ids for i in ids], dtype=bool)
        return EncodedText(
            input_ids=ids,
            token_type_ids=[0] * len(ids) if self._uses_token_types else None,
            raw_tokens=raw_tokens,
            special_mask=special_mask,
            word_ids=np.where(special_mask, -1, np.arange(len(ids))),
            words=self.display.display(raw_tokens),
            segment_ids=np.zeros(len(ids), dtype=np.int64),
            text=self.tokenizer.decode(ids),
            text_pair=None,
            truncated=num_input_tokens > len(ids),
            num_input_tokens=num_input_tokens,
        )
