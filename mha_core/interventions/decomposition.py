"""Why a head attends where it does: one (query, key) score split into (query-side source, key-side source) pairs.

The score a head gives a key is ``scale * q . k`` (plus any position bias: MPNet's relative bias). The query ``q`` is
the layer's input at the query's position through the head's query projection (and rotary rotation, in Llama), the
key ``k`` the same at the key's position. That input is a sum of the earlier components' outputs: the token
embedding, the position embedding (absolute models), the segment embedding (BERT pairs), each earlier head's output
through its slice of the output projection, each earlier MLP's output, and the biases (of the projections and of the
norms). With every norm's scale frozen at its value in the run, every step between them and the score is linear
(a norm's centring and gain are; a rotation is), so

    score = sum over (i, j) of scale * q_i . k_j  (+ position bias)

where ``q_i`` is source ``i`` at the query's position carried to the query, ``k_j`` source ``j`` at the key's
position carried to the key. Post-LN models (BERT, MPNet) pass each source through every later norm (their frozen
scales and centring); pre-LN models (GPT-2, Llama) through the layer's own first norm only. Activations are read
at the named hook points (``attn.hook_z``, ``hook_mlp_out``, ``hook_resid_pre``, ``hook_attn_out``,
``hook_resid_post``, the norms' ``hook_scale``, ``attn.hook_attn_scores``) of one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..engine import blocks
from ..engine.core import core_model
from ..engine.mpnet import mpnet_position_bias
from ..hooks import block_point
from ..models.outputs import padded
from ..models.tokens import EncodedText, check_text
from ..progress import Progress, report
from .attribution import head_outputs
from .readout import CircuitError, frozen_norm

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

FAMILIES = ("bert", "mpnet", "gpt2", "llama")
BIASES = ("biases", None, None)
POSITION_BIAS = "position bias"
OTHER_SOURCES = "other sources"
# The decomposition's sum must give the model's own score to this fraction of the layer's largest score size
# (float32 passes; the sum itself is taken in float64).
IDENTITY_TOLERANCE = 1e-3


def source_label(source: tuple) -> str:
    """A source in words: ``("head", 17, 3)`` -> ``"17-3"``, ``("mlp", 4, None)`` -> ``"MLP 4"``."""
    kind, layer, head = source
    return {
        "head": f"{layer}-{head}",
        "mlp": f"MLP {layer}",
        "embed": "token embedding",
        "pos_embed": "position embedding",
        "segment": "segment embedding",
        "biases": "biases",
    }[kind]


@dataclass(frozen=True)
class ScoreDecomposition:
    """One head's score of one (query, key) pair, split by source on each side.

    ``matrix[i, j]``: the part of the score from query-side source ``sources[i]`` meeting key-side source
    ``sources[j]`` (float64); ``position_bias``: the score's part that no source carries (MPNet's relative bias, 0
    elsewhere). ``matrix.sum() + position_bias`` is the model's own ``score`` to float32 rounding (checked when it is
    computed). ``weight``: the attention weight the pass gave the key."""

    model: str
    family: str
    layer: int
    head: int
    query: int
    key: int
    tokens: tuple
    sources: tuple  # (kind, layer, head) per source: "biases", "embed", "pos_embed", "segment", "head", "mlp"
    matrix: np.ndarray  # [sources, sources]: query-side source x key-side source
    position_bias: float
    score: float
    weight: float
    post_norm: bool

    @property
    def labels(self) -> list[str]:
        return [source_label(source) for source in self.sources]

    @property
    def total(self) -> float:
        """The decomposition's sum, which equals ``score`` to float32 rounding."""
        return float(self.matrix.sum() + self.position_bias)

    def side(self, side: str) -> pd.Series:
        """Each source's part of the score on one side (``"query"`` or ``"key"``): on the query side, source ``i``
        at the query's position meeting the whole key (``matrix[i].sum()``); on the key side the transpose."""
        if side not in ("query", "key"):
            raise ValueError(f"side must be 'query' or 'key', not {side!r}")
        values = self.matrix.sum(axis=1 if side == "query" else 0)
        return pd.Series(values, index=self.labels, name=f"{side} side")

    def table(self) -> pd.DataFrame:
        """Every (query source, key source) pair with its contribution, largest magnitude first, with the position
        bias as a row of its own where the model has one. The contributions sum to ``score``."""
        labels = self.labels
        count = len(labels)
        frame = pd.DataFrame(
            {
                "query_source": np.repeat(labels, count),
                "key_source": np.tile(labels, count),
                "contribution": self.matrix.reshape(-1),
            }
        )
        if self.family == "mpnet":
            bias = pd.DataFrame(
                {"query_source": [POSITION_BIAS], "key_source": [POSITION_BIAS], "contribution": [self.position_bias]}
            )
            frame = pd.concat([frame, bias], ignore_index=True)
        order = np.argsort(-frame["contribution"].abs().to_numpy(), kind="stable")
        frame = frame.iloc[order].reset_index(drop=True)
        frame.attrs.update(score=self.score, layer=self.layer, head=self.head, query=self.query, key=self.key)
        return frame

    def grouped(self, top: int = 12) -> tuple[np.ndarray, list[str], list[str]]:
        """The matrix cut to the ``top`` sources of each side (largest in magnitude, in source order), the rest of
        each side summed as ``"other sources"``: ``(matrix, query labels, key labels)``, whose sum is still the
        matrix's (a heatmap of a deep model's few hundred sources each side would be unreadable)."""
        if top < 1:
            raise ValueError(f"top must be at least 1, not {top}")
        labels = self.labels
        chosen = []
        for axis in (1, 0):
            magnitude = np.abs(self.matrix.sum(axis=axis))
            chosen.append(np.sort(np.argsort(-magnitude, kind="stable")[:top]))
        rows, columns = chosen
        matrix = self.matrix
        row_labels, column_labels = [labels[i] for i in rows], [labels[j] for j in columns]
        rest_rows = np.setdiff1d(np.arange(len(labels)), rows)
        rest_columns = np.setdiff1d(np.arange(len(labels)), columns)
        blocks = [[matrix[np.ix_(rows, columns)]]]
        if len(rest_columns):
            blocks[0].append(matrix[np.ix_(rows, rest_columns)].sum(axis=1, keepdims=True))
            column_labels.append(OTHER_SOURCES)
        if len(rest_rows):
            bottom = [matrix[np.ix_(rest_rows, columns)].sum(axis=0, keepdims=True)]
            if len(rest_columns):
                bottom.append(matrix[np.ix_(rest_rows, rest_columns)].sum(keepdims=True).reshape(1, 1))
            blocks.append(bottom)
            row_labels.append(OTHER_SOURCES)
        return np.block(blocks), row_labels, column_labels

    def top_source(self, side: str) -> tuple[str, float]:
        """The source whose part of ``side`` is largest in magnitude, and that part."""
        values = self.side(side)
        label = values.abs().idxmax()
        return label, float(values[label])

    def norm_words(self) -> str:
        """What was frozen, in words."""
        if self.post_norm:
            return (
                "Each LayerNorm's scale (its input's standard deviation) is frozen at its value in this run; with it "
                "fixed, the norm's centring and gain are linear, so every earlier source passes through every later "
                "norm and the parts add up exactly to the score."
            )
        kind = "RMSNorm" if self.family == "llama" else "LayerNorm"
        rotary = " The rotary rotation of each position is linear too." if self.family == "llama" else ""
        return (
            f"The layer's {kind} scale at the query's and at the key's position is frozen at its value in this run; "
            f"with it fixed the norm is linear, so the parts add up exactly to the score.{rotary}"
        )

    def summary(self) -> list[str]:
        """One sentence per side: where most of it comes from."""
        name = f"{self.layer}-{self.head}"
        sentences = []
        for side, position in (("query", self.query), ("key", self.key)):
            label, value = self.top_source(side)
            where = f"at the {side}'s position ({quote_token(self.tokens[position])}, {position})"
            sentences.append(
                f"The {side} side of {name}'s score comes mostly from {source_phrase(label)} {where}: "
                f"{value:+.2f} of {self.score:.2f}."
            )
        return sentences

    def question(self) -> str:
        """The question ``why`` answers, for a class: "Why does head 3-7 look at 'cat' from 'barked'?"."""
        query_token, key_token = quote_token(self.tokens[self.query]), quote_token(self.tokens[self.key])
        return f"Why does head {self.layer}-{self.head} look at {key_token} from {query_token}?"

    def why(self) -> str:
        """A sentence for a class: why this head looks at the key, from the largest pair (its part of the score) and
        the runner-up (the ranked table's first two rows; a part may add to the score or take away from it)."""
        query_token, key_token = quote_token(self.tokens[self.query]), quote_token(self.tokens[self.key])
        table = self.table()
        parts = [f"the largest part is {self._pair_words(table.iloc[0])} ({table.iloc[0]['contribution']:+.2f})"]
        if len(table) > 1:
            parts.append(f"the next {self._pair_words(table.iloc[1])} ({table.iloc[1]['contribution']:+.2f})")
        return (
            f"Head {self.layer}-{self.head} looks from {query_token} at {key_token} ({self.weight:.0%} of its "
            f"attention): of its score {self.score:.2f}, " + ", ".join(parts) + "."
        )

    def _pair_words(self, pair) -> str:
        """One row of ``table`` in words: a query-side source at the query meeting a key-side source at the key."""
        if pair["query_source"] == POSITION_BIAS:
            return "its learned bias for that distance"
        query_token, key_token = quote_token(self.tokens[self.query]), quote_token(self.tokens[self.key])
        return (
            f"{source_phrase(pair['query_source'])} at {query_token} meeting "
            f"{source_phrase(pair['key_source'])} at {key_token}"
        )


def source_phrase(label: str) -> str:
    """A source's label as a phrase: "head 17-3's output", "MLP 4's output", "the token embedding"."""
    if label[0].isdigit():
        return f"head {label}'s output"
    return f"{label}'s output" if label.startswith("MLP") else f"the {label}"


def quote_token(token: str) -> str:
    return "'" + str(token).strip() + "'"


# ---- the computation --------------------------------------------------------------------------------------------
def score_decomposition(
    model: LoadedModel,
    text: str | EncodedText,
    layer: int,
    head: int,
    query: int,
    key: int,
    progress: Progress | None = None,
    engine: str = "transformers",
) -> ScoreDecomposition:
    """The score head ``(layer, head)`` gives ``key`` from ``query`` (token positions in the tokenized ``text``),
    split into (query-side source, key-side source) parts that sum to the model's own score (a ``ScoreDecomposition``).

    Sources: the token embedding, the position embedding (absolute models), the segment embedding (BERT), each
    earlier head's output, each earlier MLP's output, and the biases. Every norm's scale is frozen at its value in
    the run. BERT-family (not ELECTRA), MPNet, GPT-2 and Llama-family models; anything else is a ``CircuitError``."""
    return score_decompositions(model, text, [(layer, head, query, key)], progress=progress, engine=engine)[0]


def score_decompositions(
    model: LoadedModel,
    text: str | EncodedText,
    cells: list[tuple[int, int, int, int]],
    progress: Progress | None = None,
    engine: str = "transformers",
) -> list[ScoreDecomposition]:
    """``score_decomposition`` of several cells ``(layer, head, query, key)`` of one text, from one pass."""
    family = model.family
    if family not in FAMILIES or model.modules is None:
        raise CircuitError(
            f"The score decomposition knows BERT, MPNet, GPT-2 and Llama-family models; {model.name!r} is "
            f"{model.model_type!r}."
        )
    if hasattr(model.hf_model, "embeddings_project"):
        raise CircuitError("The score decomposition does not follow ELECTRA's embedding projection.")
    encoded = text if isinstance(text, EncodedText) else model.encode(check_text(text, "text"))
    cells = [checked_cell(model, len(encoded), cell) for cell in cells]
    if not cells:
        return []
    report(progress, 0, 2, "running the text")
    cache = cached_points(model, encoded, {cell[0] for cell in cells}, engine)
    report(progress, 1, 2, "splitting the score")
    tokens = tuple(model.display.display(encoded.raw_tokens, encoded.word_ids))
    decompositions = [one_cell(model, encoded, cache, cell, tokens) for cell in cells]
    report(progress, 2, 2, "done")
    return decompositions


def one_cell(model: LoadedModel, encoded: EncodedText, cache: dict, cell: tuple, tokens: tuple) -> ScoreDecomposition:
    """One cell's decomposition from the pass's ``cache``, its sum checked against the model's score."""
    layer, head, query, key = cell
    with torch.inference_mode():
        sources, matrix, position_bias = split_score(model, encoded, cache, cell)
    scores = cache[block_point(layer, "attn.hook_attn_scores")][0, head].double()
    score = float(scores[query, key])
    total = float(matrix.sum()) + position_bias
    size = float(scores[torch.isfinite(scores)].abs().max())
    if abs(total - score) > IDENTITY_TOLERANCE * max(size, 1.0):
        raise CircuitError(
            f"The parts of the score add up to {total:.4f}, the model's score is {score:.4f}: this {model.model_type!r} "
            "model computes its scores in a way the decomposition does not follow."
        )
    return ScoreDecomposition(
        model=model.name,
        family=model.family,
        layer=layer,
        head=head,
        query=query,
        key=key,
        tokens=tokens,
        sources=tuple(sources),
        matrix=matrix.numpy(),
        position_bias=position_bias,
        score=score,
        weight=float(cache[block_point(layer, "attn.hook_pattern")][0, head, query, key]),
        post_norm=model.family in ("bert", "mpnet"),
    )


def split_score(model: LoadedModel, encoded: EncodedText, cache: dict, cell: tuple):
    """``(sources, matrix [sources, sources] float64, position bias)`` of one cell ``(layer, head, query, key)``."""
    layer, head, query, key = cell
    sides = {}
    for position in dict.fromkeys((query, key)):
        sources, sides[position] = layer_input_sources(model, encoded, cache, layer, position)
    queries, keys = head_sides(model, layer, head, sides[query], sides[key])
    if model.family == "llama":
        cos, sin = blocks.rotary_angles(len(encoded), *core_model(model.hf_model).rope)
        queries = blocks.rotate(queries, cos[query].double(), sin[query].double())
        keys = blocks.rotate(keys, cos[key].double(), sin[key].double())
    matrix = score_scale(model, layer, queries.shape[-1]) * (queries @ keys.T)
    position_bias = 0.0
    if model.family == "mpnet":
        position_bias = float(mpnet_position_bias(core_model(model.hf_model), len(encoded))[0, head, query, key])
    return sources, matrix, position_bias


def checked_cell(model: LoadedModel, length: int, cell: tuple) -> tuple[int, int, int, int]:
    """``(layer, head, query, key)`` as indices, with a clear error for one outside the model or the text, or (in a
    decoder) a key after the query, which the query never sees."""
    layer, head, query, key = (int(value) for value in cell)
    if not 0 <= layer < model.num_layers:
        raise CircuitError(
            f"Layer {layer} is outside the model's {model.num_layers} layers (0-{model.num_layers - 1})."
        )
    if not 0 <= head < model.num_heads:
        raise CircuitError(f"Head {head} is outside the layer's {model.num_heads} heads (0-{model.num_heads - 1}).")
    for what, position in (("query", query), ("key", key)):
        if not 0 <= position < length:
            raise CircuitError(
                f"The {what} position {position} is outside the text's {length} tokens (0-{length - 1})."
            )
    if model.is_causal and key > query:
        raise CircuitError(
            f"The key {key} comes after the query {query}: a decoder's query sees only itself and earlier tokens, so "
            "the pair has no score."
        )
    return layer, head, query, key


def cached_points(model: LoadedModel, encoded: EncodedText, layers: set[int], engine: str) -> dict:
    """One pass keeping the points the decomposition reads for heads of ``layers``."""
    names = {"hook_embed", "hook_pos_embed"}
    for index in range(max(layers)):
        names.update(block_point(index, point) for point in ("attn.hook_z", "hook_mlp_out"))
        names.update(block_point(index, point) for point in ("hook_resid_pre", "hook_attn_out", "hook_resid_post"))
        names.update(block_point(index, point) for point in ("ln1.hook_scale", "ln2.hook_scale"))
    for layer in layers:
        names.update(block_point(layer, point) for point in ("hook_resid_pre", "ln1.hook_scale"))
        names.update(block_point(layer, point) for point in ("attn.hook_attn_scores", "attn.hook_pattern"))
    # Only the kept points: no capture of every layer's weights (and no second, reference pass in the core engine).
    forward = padded(model, [encoded]).with_changes(keep=names.__contains__, attentions=False)
    return model.run_pass(forward, engine).cache


def layer_input_sources(model: LoadedModel, encoded: EncodedText, cache: dict, layer: int, position: int):
    """The sources of the input the attention of ``layer`` reads at ``position``: ``(sources, [sources, d] float64)``,
    whose rows sum to that input (post-LN: the layer's input; pre-LN: its first norm's output)."""
    post_norm = model.family in ("bert", "mpnet")
    stack_modules = model.modules.stacks["blocks"]

    def point(name: str, index: int | None = None) -> torch.Tensor:
        full = name if index is None else block_point(index, name)
        return cache[full][0, position].double()

    sources = [BIASES, ("embed", None, None)]
    vectors = [None, point("hook_embed")]
    if "hook_pos_embed" in cache:
        sources.append(("pos_embed", None, None))
        vectors.append(point("hook_pos_embed"))
    if post_norm:
        segment = segment_vector(model, encoded, position)
        if segment is not None:
            sources.append(("segment", None, None))
            vectors.append(segment)
    vectors[0] = torch.zeros_like(vectors[1])
    stream = torch.stack(vectors)
    if post_norm:  # the embeddings' LayerNorm: its scale from its input, the sum of the vectors
        stream = through_norm(stream, model.hf_model.embeddings.LayerNorm, None)
    projections = model.output_projections()
    for index in range(layer):
        per_head, bias = head_outputs(projections[index], cache[block_point(index, "attn.hook_z")][0, position].float())
        sources.extend(("head", index, h) for h in range(per_head.shape[0]))
        stream = torch.cat([stream, per_head.double()])
        stream[0] += bias.double()
        norms = stack_modules.layers[index].norms
        if post_norm:
            stream = through_norm(stream, norms[0], point("ln1.hook_scale", index))
        sources.append(("mlp", index, None))
        stream = torch.cat([stream, point("hook_mlp_out", index)[None]])
        if post_norm:
            stream = through_norm(stream, norms[1], point("ln2.hook_scale", index))
    if not post_norm:  # pre-LN: the attention reads its first norm's output
        stream = through_norm(stream, stack_modules.layers[layer].norms[0], point("ln1.hook_scale", layer))
    return sources, stream


def through_norm(stream: torch.Tensor, norm: torch.nn.Module, scale: torch.Tensor | None) -> torch.Tensor:
    """Every row of ``stream`` through ``norm`` with its scale frozen (``scale``: the run's, from its point; None:
    computed here from the rows' sum, for the embeddings' norm, which has no point); its bias joins row 0, the
    biases' row. ``readout.frozen_norm`` checks the frozen form against the module's own output."""
    residual = stream.sum(0)
    if scale is None:
        centred = residual - residual.mean()
        scale = (centred.pow(2).mean() + norm.eps).sqrt()
    frozen = frozen_norm(norm, residual, float(scale.reshape(-1)[0]))
    normed = frozen(stream)
    if frozen.bias is not None:
        normed[0] += frozen.bias
    return normed


def segment_vector(model: LoadedModel, encoded: EncodedText, position: int) -> torch.Tensor | None:
    """The segment (token type) vector BERT adds at ``position``, or None for a model without one."""
    table = getattr(model.hf_model.embeddings, "token_type_embeddings", None)
    if table is None:
        return None
    segment = 0 if encoded.token_type_ids is None or not model.uses_token_types else encoded.token_type_ids[position]
    return table.weight[int(segment)].detach().double()


def head_sides(model: LoadedModel, layer: int, head: int, query_stream, key_stream):
    """Every source's query vector (from ``query_stream``) and key vector (from ``key_stream``) for ``head``: the
    projections' linear parts applied to each row, their biases added to the biases' row (row 0)."""
    projections = model.modules.stacks["blocks"].layers[layer].attention.projections

    def project(module, stream, part):
        weight_dtype = next(module.parameters()).dtype
        with torch.inference_mode():
            bias = module(torch.zeros(1, stream.shape[1], dtype=weight_dtype)).double()[0]
            projected = module(stream.to(weight_dtype)).double() - bias
        if len(projections) == 1:  # GPT-2: one projection gives [q | k | v]
            projected, bias = (t.split(t.shape[-1] // 3, dim=-1)[part] for t in (projected, bias))
        projected[0] += bias
        return projected

    q_module, k_module = (projections[0], projections[0]) if len(projections) == 1 else projections[:2]
    queries = project(q_module, query_stream, 0)
    keys = project(k_module, key_stream, 1)
    d_head = queries.shape[-1] // model.num_heads
    kv_heads = keys.shape[-1] // d_head
    kv_head = head // (model.num_heads // kv_heads)
    return queries[:, head * d_head : (head + 1) * d_head], keys[:, kv_head * d_head : (kv_head + 1) * d_head]


def score_scale(model: LoadedModel, layer: int, d_head: int) -> float:
    """What q . k is multiplied by: 1 / sqrt(d_head) (GPT-2: only with ``scale_attn_weights``; and 1 / (layer + 1)
    with ``scale_attn_by_inverse_layer_idx``)."""
    config = model.hf_model.config
    scale = 1.0 / math.sqrt(d_head)
    if model.family == "gpt2":
        scale = scale if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= layer + 1
    scaling = getattr(config, "query_pre_attn_scalar", None)
    if scaling is not None:
        scale = float(scaling) ** -0.5
    return scale
