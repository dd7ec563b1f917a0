"""Corpora: a file read lazily, one sentence at a time (text, ``.csv`` / ``.parquet`` column, ``.conllu``), or the
shipped UD English EWT dev split."""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Iterator
from pathlib import Path

from ..analysis.syntax import Sentence, iter_conllu, ud_ewt_dev
from ..errors import HeadscopeError, InputTextError

# ---- corpora --------------------------------------------------------------------------------
# Files read lazily, by extension: a table's sentences come from one column, a treebank's from its trees.
TABLE_SUFFIXES = (".csv", ".parquet")


# Rows read from a table at a time: a few MB, whatever the file's size.
TABLE_BATCH_ROWS = 8192


class CorpusFile:
    """A corpus file read lazily: each iteration opens the file again and yields one sentence at a time.

    ``.conllu``: ``Sentence`` trees (parsed incrementally); ``.csv`` / ``.parquet``: the strings of one
    column (``column``; by default the column named ``text``, or the only column), read in batches of
    rows with pyarrow; any other file: one sentence per non-blank line. Blank sentences are skipped.
    ``max_sentences`` stops after that many. Memory stays that of one batch, whatever the file's size,
    so ``profile`` can stream millions of sentences (it iterates twice: once to plan, once to compute).
    """

    def __init__(self, path: str | Path, column: str | None = None, max_sentences: int | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise HeadscopeError(f"corpus {str(path)!r} is neither 'ud-ewt-dev' nor an existing file")
        if max_sentences is not None and max_sentences < 1:
            raise HeadscopeError(f"max_sentences must be at least 1, got {max_sentences}")
        self.suffix = self.path.suffix.lower()
        if column is not None and self.suffix not in TABLE_SUFFIXES:
            raise HeadscopeError(f"a column is chosen only in a .csv or .parquet corpus, not in {self.path.name!r}")
        self.max_sentences = max_sentences
        self.column = self._table_column(column) if self.suffix in TABLE_SUFFIXES else None
        if self.suffix not in TABLE_SUFFIXES:
            self._check_text_start()

    def _check_text_start(self) -> None:
        """A text or CoNLL-U corpus must be UTF-8: its first 64 KB are checked here, before any slow work (a
        binary file given by mistake), and the rest as it is read."""

        try:
            with open(self.path, "rb") as handle:
                codecs.getincrementaldecoder("utf-8")().decode(handle.read(1 << 16), final=False)
        except UnicodeDecodeError as exc:
            raise self._not_text(exc) from exc
        except OSError as exc:
            raise HeadscopeError(f"cannot read the corpus {self.path.name!r}: {exc.strerror}") from exc

    def _not_text(self, exc: UnicodeDecodeError) -> HeadscopeError:
        return HeadscopeError(
            f"the corpus {self.path.name!r} is not UTF-8 text (byte {exc.start} of a block): give a text file with "
            "one sentence per line, a .conllu treebank, or a .csv / .parquet table"
        )

    def __repr__(self) -> str:
        return f"CorpusFile({self.path.name!r}, column={self.column!r}, max_sentences={self.max_sentences})"

    def __iter__(self) -> Iterator[Sentence | str]:
        return itertools.islice(self._sentences(), self.max_sentences)

    def _sentences(self) -> Iterator[Sentence | str]:
        if self.suffix == ".conllu":
            yield from iter_conllu(self.path)
            return
        if self.suffix in TABLE_SUFFIXES:
            for batch in self._batches([self.column]):
                for value in batch.column(0).to_pylist():
                    if value is not None and str(value).strip():
                        yield str(value).strip()
            return
        try:
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        yield line.strip()
        except UnicodeDecodeError as exc:
            raise self._not_text(exc) from exc

    def _batches(self, columns: list[str] | None):
        """pyarrow record batches of a table's ``columns`` (None: all), a few thousand rows at a time."""
        try:
            if self.suffix == ".parquet":
                import pyarrow.parquet as pq  # pyarrow: only for Parquet corpora

                yield from pq.ParquetFile(self.path).iter_batches(batch_size=TABLE_BATCH_ROWS, columns=columns)
                return
            import pyarrow.csv as pacsv  # pyarrow: only for CSV corpora

            reader = pacsv.open_csv(
                self.path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types=dict.fromkeys(columns or [], "string")
                ),
            )
            yield from reader
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
            raise HeadscopeError(f"cannot read {self.path.name!r} as a {self.suffix[1:]} table: {exc}") from exc

    def _table_column(self, column: str | None) -> str:
        if self.suffix == ".parquet":
            import pyarrow.parquet as pq  # pyarrow: only for Parquet corpora

            try:
                names = list(pq.read_schema(self.path).names)
            except (OSError, ValueError) as exc:
                raise HeadscopeError(f"cannot read {self.path.name!r} as a parquet table: {exc}") from exc
        else:
            names = next(iter(self._batches(None)), None)
            names = [] if names is None else list(names.schema.names)
        if column is None:
            column = "text" if "text" in names else names[0] if len(names) == 1 else None
            if column is None:
                raise HeadscopeError(
                    f"{self.path.name!r} has columns {', '.join(map(repr, names))}: choose the sentences' column"
                )
        if column not in names:
            raise HeadscopeError(f"{self.path.name!r} has no column {column!r} (it has {', '.join(map(repr, names))})")
        return column


def open_corpus(
    spec: str | Path, column: str | None = None, max_sentences: int | None = None
) -> list[Sentence] | CorpusFile:
    """A corpus to profile, read lazily: ``"ud-ewt-dev"`` (the shipped UD dev split, a list), or a
    ``CorpusFile`` (``.conllu``, ``.csv`` / ``.parquet`` with ``column``, or text with one sentence per line)."""
    if max_sentences is not None and max_sentences < 1:
        raise HeadscopeError(f"max_sentences must be at least 1, got {max_sentences}")
    if str(spec) == "ud-ewt-dev":
        if column is not None:
            raise HeadscopeError("ud-ewt-dev is a treebank: it has no column to choose")
        return ud_ewt_dev(max_sentences)
    return CorpusFile(spec, column, max_sentences)


def read_corpus(spec: str, max_sentences: int | None = None, column: str | None = None) -> list[Sentence] | list[str]:
    """The whole corpus in memory (``open_corpus``, read to the end); HeadscopeError when it holds no sentences."""
    sentences = list(open_corpus(spec, column, max_sentences))
    if not sentences:
        raise HeadscopeError(f"corpus {spec!r} holds no sentences")
    return sentences


def model_input(sentence: Sentence | str) -> str | list[str]:
    # Trees are run on their own words so that the run's words are the tree's words.
    if isinstance(sentence, Sentence):
        return sentence.words
    if isinstance(sentence, str) and sentence.strip():
        return sentence
    raise InputTextError(f"a corpus sentence must be a non-empty string or a Sentence, got {sentence!r}")


def text_length(model_input: str | list[str]) -> int:
    return sum(len(word) + 1 for word in model_input) if isinstance(model_input, list) else len(model_input)


def corpus_texts(sentences) -> list[str]:
    """Plain texts of a corpus (``read_corpus``): trees become their words joined by spaces."""
    return [" ".join(s.words) if hasattr(s, "words") else str(s) for s in sentences]
