"""One head's queries and keys over a corpus in one 2-D projection (AttentionViz, Yeh et al. 2023).

A head scores key ``j`` from query ``i`` as ``s * q_i . k_j`` (``s`` = 1/sqrt(d_head); MPNet adds a relative position
bias that depends on ``i - j`` only). The vectors are read at the named points ``blocks.{l}.attn.hook_q`` and
``hook_k`` of one pass per sentence; in a rotary model (Llama, SmolLM2) each is turned by its position's rotation
first, so that their dot product is the score (the points hold them before the rotation). A grouped-query model's
head reads its key/value group's keys.

Before the projection (``normalize=True``), as AttentionViz does, two changes that leave every attention weight
exactly as it is:

1. scale: queries times ``c``, keys divided by ``c``, ``c = sqrt(mean |k| / mean |q|)``, so that both have the same
   mean norm; every product ``q . k`` is unchanged.
2. translate: every key plus ``t = mean(queries) - mean(keys)`` (after the scaling), so both clouds share their
   centre. Query ``i``'s score for every key then gains the same ``s * q_i . t``, and the softmax over a row is
   invariant to a constant added to the whole row: ``softmax(z + a) = softmax(z)``. The weights do not change
   (``tests/mha_core/analysis/test_joint_qk.py`` checks it against the model's own weights), while a key now sits
   near the queries that score it highly rather than off in a corner of its own.

Then PCA (torch SVD of the centred points, each axis's sign fixed so that its largest loading is positive: the same
input gives the same picture) or t-SNE (scikit-learn's, seeded). UMAP is not offered: no pinned package provides it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..engine import blocks
from ..engine.core import core_model
from ..errors import HeadscopeError
from ..hooks import block_point
from ..models.tokens import EncodedText
from ..progress import Progress, report

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

METHODS = {"pca": "PCA", "tsne": "t-SNE"}
DEFAULT_MAX_POINTS = 2000  # queries (and as many keys) at most: the projection of 4,000 points stays quick
TSNE_PERPLEXITY = 30.0
COLUMNS = ("kind", "sentence", "position", "token", "pos", "x", "y")


class JointQKError(HeadscopeError, ValueError):
    """A joint query-key view that cannot be made: a method that does not exist, a head outside the model, no
    tokens."""


@dataclass(frozen=True)
class CorpusText:
    """One sentence as the view reads it: its tokens (encoded once) and each token's POS tag ("" where the corpus
    has no tree, or for a special token)."""

    encoded: EncodedText
    tags: tuple[str, ...]


@dataclass(frozen=True)
class Projection:
    """How the points are projected: ``method`` ("pca" or "tsne"), ``normalize`` (the keys moved onto the queries'
    centre and both scaled to one mean norm), at most ``max_points`` queries and as many keys, read by ``engine``."""

    method: str = "pca"
    normalize: bool = True
    max_points: int = DEFAULT_MAX_POINTS
    engine: str = "transformers"


@dataclass
class JointQK:
    """The projection: ``table`` (``COLUMNS``: kind "query" or "key", sentence index, position, token, POS tag, x,
    y; queries first), the share of the variance each PCA axis explains (None for t-SNE), the scale ``c`` and the
    translation's length (0 and 1 when not normalised), and each sentence's tokens and text (for a point's
    context)."""

    model: str
    layer: int
    head: int
    method: str
    normalize: bool
    table: pd.DataFrame
    explained_variance: tuple[float, float] | None
    scale: float
    translation_norm: float
    sentence_tokens: tuple[tuple[str, ...], ...]
    sentence_texts: tuple[str, ...]

    def context(self, sentence: int, position: int) -> tuple[tuple[str, ...], int]:
        """(the sentence's tokens, the position to mark): where a point comes from."""
        return self.sentence_tokens[sentence], int(position)


def check_one_stack(model) -> None:
    """A clear error for an encoder-decoder model (its stacks' points have other names)."""
    if not hasattr(model, "encode") or not hasattr(model, "run_with_cache"):
        raise JointQKError(
            f"{model.name} is an encoder-decoder model: the joint query-key view follows one-stack models."
        )


def encode_corpus(model: LoadedModel, sentences: Iterable) -> list[CorpusText]:
    """Each sentence (a string, a list of words, a ``Sentence`` tree or an ``EncodedText``) encoded once, with the
    tree's POS tags carried to its tokens."""
    check_one_stack(model)
    texts = []
    for sentence in sentences:
        words_tags = getattr(sentence, "tags", None)
        if isinstance(sentence, EncodedText):
            encoded = sentence
        else:
            encoded = model.encode(getattr(sentence, "words", sentence))
        tags = tuple(
            words_tags[word] if words_tags and word >= 0 else "" for word in (int(w) for w in encoded.word_ids)
        )
        texts.append(CorpusText(encoded, tags))
    if not texts:
        raise JointQKError("The corpus holds no sentences: a joint query-key view needs at least one.")
    return texts


def check_view(model: LoadedModel, layer: int, head: int, method: str, max_points: int) -> None:
    """A clear error for a head outside the model, an unknown method or a bound below 2 points."""
    if method not in METHODS:
        raise JointQKError(
            f"No projection {method!r}: the joint query-key view projects by {', '.join(map(repr, METHODS))} "
            "(UMAP is not installed with Headscope)."
        )
    if not 0 <= int(layer) < model.num_layers:
        raise JointQKError(
            f"Layer {layer} is outside the model's {model.num_layers} layers (0-{model.num_layers - 1})."
        )
    if not 0 <= int(head) < model.num_heads:
        raise JointQKError(f"Head {head} is outside the layer's {model.num_heads} heads (0-{model.num_heads - 1}).")
    check_one_stack(model)
    if int(max_points) < 2:
        raise JointQKError(f"max_points must be at least 2, got {max_points}.")


def head_vectors(
    model: LoadedModel, encoded: EncodedText, layer: int, head: int, engine: str = "transformers"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, keys)``, each ``[n, d_head]`` float32: head ``(layer, head)``'s vectors at every position of one
    pass, rotated in a rotary model, its group's keys in a grouped-query model: ``s * queries @ keys.T`` is the
    head's score (before any position bias and mask)."""
    names = [block_point(layer, "attn.hook_q"), block_point(layer, "attn.hook_k")]
    _, cache = model.run_with_cache(encoded, names=names, engine=engine, losses=False)
    queries_all, keys_all = cache[names[0]][0], cache[names[1]][0]  # [n, h, e], [n, kv, e]
    group = queries_all.shape[1] // keys_all.shape[1]
    queries, keys = queries_all[:, head].float(), keys_all[:, head // group].float()
    if model.family == "llama":
        cos, sin = blocks.rotary_angles(len(encoded), *core_model(model.hf_model).rope)
        queries, keys = blocks.rotate(queries, cos, sin), blocks.rotate(keys, cos, sin)
    return queries, keys


def normalized(queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor]:
    """``(queries * c, keys / c + t, c, t)``: equal mean norms, then the keys' mean moved onto the queries' (the
    module's docstring: every attention weight stays as it was)."""
    scale = math.sqrt(float(keys.norm(dim=-1).mean()) / max(float(queries.norm(dim=-1).mean()), 1e-30))
    scaled_queries, scaled_keys = queries * scale, keys / max(scale, 1e-30)
    translation = scaled_queries.mean(dim=0) - scaled_keys.mean(dim=0)
    return scaled_queries, scaled_keys + translation, scale, translation


def pca_2d(points: torch.Tensor) -> tuple[np.ndarray, tuple[float, float]]:
    """``(coordinates [m, 2], explained variance ratio of both axes)``: the centred points on their first two
    principal axes (float64 SVD), each axis's sign chosen so that its largest loading is positive."""
    centred = points.double() - points.double().mean(dim=0)
    _, singular, axes = torch.linalg.svd(centred, full_matrices=False)
    axes = axes[:2]
    if axes.shape[0] < 2:  # one dimension (or one point): the second axis is empty
        axes = torch.cat([axes, torch.zeros(2 - axes.shape[0], centred.shape[1], dtype=axes.dtype)])
    largest = axes.gather(1, axes.abs().argmax(dim=1, keepdim=True))
    axes = axes * torch.where(largest < 0, -1.0, 1.0).to(axes.dtype)
    total = float((singular**2).sum())
    ratio = (singular[:2] ** 2 / total).tolist() if total > 0 else [0.0, 0.0]
    ratio = (ratio + [0.0, 0.0])[:2]
    return (centred @ axes.T).numpy(), (float(ratio[0]), float(ratio[1]))


def tsne_2d(points: torch.Tensor) -> np.ndarray:
    """t-SNE (scikit-learn, PCA start, seed 0): perplexity 30, or less for a small corpus (it must stay below the
    number of points)."""
    from sklearn.manifold import TSNE  # scikit-learn: only for t-SNE

    count = points.shape[0]
    perplexity = min(TSNE_PERPLEXITY, max(1.0, (count - 1) / 3))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=0).fit_transform(
        points.double().numpy()
    )


def project_texts(
    model: LoadedModel,
    texts: Sequence[CorpusText],
    cell: tuple[int, int],
    projection: Projection | None = None,
    progress: Progress | None = None,
) -> JointQK:
    """``joint_qk`` on texts already encoded (``encode_corpus``); ``cell`` is ``(layer, head)``; ``projection``: how
    (PCA of the normalised points by default)."""
    layer, head = int(cell[0]), int(cell[1])
    projection = projection or Projection()
    method, normalize, max_points = projection.method, projection.normalize, projection.max_points
    check_view(model, layer, head, method, max_points)
    queries, keys, rows, used = [], [], [], []
    taken = 0
    for index, text in enumerate(texts):
        if taken >= max_points:
            break
        report(progress, index, len(texts), f"Queries and keys of sentence {index + 1}")
        q, k = head_vectors(model, text.encoded, layer, head, projection.engine)
        count = min(len(text.encoded), int(max_points) - taken)
        queries.append(q[:count])
        keys.append(k[:count])
        tokens = model.display.display(text.encoded.raw_tokens, text.encoded.word_ids)
        rows += [(index, position, tokens[position], text.tags[position]) for position in range(count)]
        used.append((tuple(tokens), text.encoded.text))
        taken += count
    report(progress, len(texts), len(texts), "Projection")
    q_all, k_all = torch.cat(queries), torch.cat(keys)
    scale, translation = 1.0, torch.zeros(q_all.shape[1])
    if normalize:
        q_all, k_all, scale, translation = normalized(q_all, k_all)
    points = torch.cat([q_all, k_all])
    if points.shape[0] < 3 and method == "tsne":
        raise JointQKError("t-SNE needs at least 3 points; give a longer text or choose PCA.")
    if method == "pca":
        coordinates, explained = pca_2d(points)
    else:
        coordinates, explained = tsne_2d(points), None
    half = len(rows)
    table = pd.DataFrame(
        {
            "kind": ["query"] * half + ["key"] * half,
            "sentence": [r[0] for r in rows] * 2,
            "position": [r[1] for r in rows] * 2,
            "token": [r[2] for r in rows] * 2,
            "pos": [r[3] for r in rows] * 2,
            "x": coordinates[:, 0].astype(np.float64),
            "y": coordinates[:, 1].astype(np.float64),
        },
        columns=list(COLUMNS),
    )
    return JointQK(
        model=model.name,
        layer=layer,
        head=head,
        method=method,
        normalize=bool(normalize),
        table=table,
        explained_variance=explained,
        scale=float(scale),
        translation_norm=float(translation.norm()),
        sentence_tokens=tuple(tokens for tokens, _ in used),
        sentence_texts=tuple(text for _, text in used),
    )


def joint_qk(
    model: LoadedModel,
    sentences: Iterable,
    layer: int,
    head: int,
    method: str = "pca",
    normalize: bool = True,
    max_points: int = DEFAULT_MAX_POINTS,
    engine: str = "transformers",
    progress: Progress | None = None,
) -> JointQK:
    """Head ``(layer, head)``'s query and key vectors over ``sentences`` (strings, lists of words, ``Sentence``
    trees: their POS tags go to the table) in one 2-D projection (``method`` "pca" or "tsne"), at most
    ``max_points`` queries and as many keys (the sentences in order, the last one cut). See the module's docstring
    for the scaling and translation ``normalize`` applies, and why they change no attention weight."""
    projection = Projection(method, normalize, max_points, engine)
    check_view(model, layer, head, method, max_points)
    return project_texts(model, encode_corpus(model, sentences), (layer, head), projection, progress)
