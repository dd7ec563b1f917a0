"""Search a corpus for tokens like this one (exBERT's idea): nearest neighbours of token vectors.

Pick a token of a sentence, a layer and a head; the index holds one vector per word token of a corpus
(by default the UD English EWT dev sentences), and a nearest-neighbour search (scikit-learn's
``NearestNeighbors``) returns the tokens whose vectors are closest, shown in their sentences.

Two kinds of vector:
  representation  the hidden state entering the layer (what that layer's heads read; layer 0: the
                  embeddings), compared by cosine distance;
  attention       the head's attention row as a fixed-length pattern: the weight on keys at offsets
                  -W..+W from the query (further keys counted in the end bins) and the weight on special
                  tokens, compared by Euclidean distance. Two tokens match when the head looks at the
                  same places relative to them (the previous word, itself, [SEP], ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import HeadscopeError
from ..progress import Progress, report

KINDS = ("representation", "attention")
OFFSET_WINDOW = 8
METRICS = {"representation": "cosine", "attention": "euclidean"}


def attention_signature(attention: np.ndarray, special_mask: np.ndarray, window: int = OFFSET_WINDOW) -> np.ndarray:
    """float32 ``[n, 2 * window + 2]``: per query, weight on non-special keys at offsets -window..+window
    (key - query; further keys in the end bins), then the weight on special tokens."""
    n = attention.shape[-1]
    special = np.asarray(special_mask, dtype=bool)
    offsets = np.clip(np.arange(n)[None, :] - np.arange(n)[:, None], -window, window) + window  # [n, n]
    signature = np.zeros((n, 2 * window + 2), dtype=np.float64)
    rows = np.repeat(np.arange(n), n).reshape(n, n)
    keep = np.broadcast_to(~special[None, :], (n, n))
    np.add.at(signature, (rows[keep], offsets[keep]), attention[keep])
    signature[:, -1] = attention[:, special].sum(axis=-1)
    return signature.astype(np.float32)


def token_vectors(model, encoded: Sequence, layer: int, head: int, kind: str, batch_size: int = 16, progress=None):
    """One float32 ``[n_i, D]`` array per encoded text: the search vectors of every token (transformers engine)."""
    if kind not in KINDS:
        raise HeadscopeError(f"Unknown kind of search {kind!r}: use one of {', '.join(KINDS)}.")
    if not 0 <= layer < model.num_layers or not 0 <= head < model.num_heads:
        raise HeadscopeError(
            f"No head ({layer}, {head}): this model has layers 0 to {model.num_layers - 1} "
            f"and heads 0 to {model.num_heads - 1}."
        )
    out: list[np.ndarray | None] = [None] * len(encoded)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths: little padding
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        items = [encoded[i] for i in chunk]
        result = model.encoded_pass(items, keep_layer_inputs=kind == "representation")
        attentions, inputs = result.attentions, result.layer_inputs
        for row, i in enumerate(chunk):
            n = len(encoded[i])
            if kind == "representation":
                out[i] = inputs[layer][row, :n].float().numpy().copy()
            else:
                out[i] = attention_signature(attentions[row, layer, head, :n, :n].numpy(), encoded[i].special_mask)
        report(progress, min(start + batch_size, len(order)), len(order), "indexing the corpus")
    return out


@dataclass
class CorpusIndex:
    """Token vectors of a corpus with a fitted scikit-learn ``NearestNeighbors`` (exact, brute force)."""

    model_name: str
    layer: int
    head: int
    kind: str
    vectors: np.ndarray  # [tokens, D]
    sentence: np.ndarray  # [tokens]: which sentence each vector's token is in
    position: np.ndarray  # [tokens]: its position in that sentence's tokens
    sentences: list[list[str]]  # display tokens of each sentence
    neighbours: object = field(repr=False, default=None)

    def __len__(self) -> int:
        return len(self.vectors)

    def search(self, vector: np.ndarray, k: int = 10, context: int = 6) -> pd.DataFrame:
        """The ``k`` nearest corpus tokens: rank, distance, token, left and right context, sentence, position."""
        k = max(1, min(int(k), len(self)))
        distances, indices = self.neighbours.kneighbors(np.asarray(vector, dtype=np.float32)[None], n_neighbors=k)
        rows = []
        for rank, (distance, index) in enumerate(zip(distances[0], indices[0]), start=1):
            sentence, position = int(self.sentence[index]), int(self.position[index])
            tokens = self.sentences[sentence]
            rows.append(
                {
                    "rank": rank,
                    "distance": float(distance),
                    "left": " ".join(tokens[max(0, position - context) : position]),
                    "token": tokens[position],
                    "right": " ".join(tokens[position + 1 : position + 1 + context]),
                    "sentence": sentence,
                    "position": position,
                }
            )
        return pd.DataFrame(rows)


def build_corpus_index(
    model,
    sentences: Sequence[Sequence[str]],
    layer: int,
    head: int = 0,
    kind: str = "representation",
    batch_size: int = 16,
    progress: Progress | None = None,
) -> CorpusIndex:
    """Index every non-special token of ``sentences`` (lists of words, e.g. UD trees' ``words``)."""
    from sklearn.neighbors import NearestNeighbors  # scikit-learn: only for corpus search

    if not sentences:
        raise HeadscopeError("The corpus to search has no sentences.")
    encoded = [model.encode(list(words)) for words in sentences]
    vectors = token_vectors(
        model=model, encoded=encoded, layer=layer, head=head, kind=kind, batch_size=batch_size, progress=progress
    )
    keep, sentence_of, position_of, shown = [], [], [], []
    for index, (item, item_vectors) in enumerate(zip(encoded, vectors)):
        shown.append(model.display.display(item.raw_tokens, item.word_ids))
        for position in np.flatnonzero(~np.asarray(item.special_mask, dtype=bool)):
            keep.append(item_vectors[position])
            sentence_of.append(index)
            position_of.append(int(position))
    matrix = np.stack(keep).astype(np.float32)
    neighbours = NearestNeighbors(metric=METRICS[kind], algorithm="brute").fit(matrix)
    return CorpusIndex(
        model_name=model.name,
        layer=layer,
        head=head,
        kind=kind,
        vectors=matrix,
        sentence=np.array(sentence_of),
        position=np.array(position_of),
        sentences=shown,
        neighbours=neighbours,
    )


def query_vector(model, token_ids: Sequence[int], position: int, layer: int, head: int, kind: str) -> np.ndarray:
    """The search vector of token ``position`` of a tokenized text, computed as the index computes its own."""
    encoded = model.encoder.encode_ids(list(token_ids), model.hf_model.get_input_embeddings().num_embeddings)
    if not 0 <= position < len(encoded):
        raise HeadscopeError(f"No token {position}: the text has tokens 0 to {len(encoded) - 1}.")
    return token_vectors(model, [encoded], layer, head, kind)[0][position]
