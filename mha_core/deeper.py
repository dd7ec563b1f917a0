"""Views beyond raw attention weights: rollout and flow, norm-based attention, the neuron view.

  * ``attention_rollout(run)`` and ``attention_flow(run)`` (Abnar & Zuidema 2020, "Quantifying
    Attention Flow in Transformers"): what each token's representation after layer l draws on from
    the input tokens, with the residual connection counted as half of every layer.
  * ``norm_based_attention`` (Kobayashi et al. 2020, "Attention is Not Only a Weight"):
    ||alpha_ij f_h(x_j)|| with f_h(x) = (x W_V^h + b_V^h) W_O^h, the vector head h actually adds
    (output bias excluded). ``model.run(text, norms=True)`` fills ``run.norms`` with it.
  * ``neuron_view(model, text, layer, head, query)`` (BertViz's neuron view): the query vector, every
    key vector, their elementwise products, the dot product, the scaled score and the softmax.

Query and key vectors come from ``engine.head_vectors`` applied to each layer's input hidden states
of the chosen engine's own pass (transformers' ``hidden_states``, or the from-scratch engine's), so
both engines give them, for every family the registry covers.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from . import engine as core_engine
from .attention import masked_softmax
from .errors import HeadscopeError
from .run import AttentionRun

MAX_FLOW_TOKENS = 48  # attention flow solves n x n max-flow problems on a graph of L * n * n edges


# ---- rollout and flow --------------------------------------------------------------------------------
def residual_attention(run: AttentionRun) -> np.ndarray:
    """A_l = 0.5 * (mean over heads of layer l) + 0.5 * I, rows renormalised: float32 ``[L, n, n]``."""
    n = run.num_tokens
    mixed = 0.5 * run.attentions.mean(axis=1, dtype=np.float64) + 0.5 * np.eye(n)
    totals = mixed.sum(axis=-1, keepdims=True)
    return (mixed / np.where(totals > 0, totals, 1.0)).astype(np.float32)


def attention_rollout(run: AttentionRun) -> np.ndarray:
    """Attention rollout, float32 ``[L, n, n]``: R_0 = A_0 and R_l = A_l @ R_(l-1).

    Row i of R_l: how much token i's representation after layer l draws on each input token.
    The products run in torch: numpy's BLAS threads, woken beside torch's own, made these small
    products 100 times slower than in torch (0.2 s against 2 ms for 12 layers of 128 tokens).
    """
    mixed = torch.from_numpy(residual_attention(run))
    rollout = torch.empty_like(mixed)
    rollout[0] = mixed[0]
    for layer in range(1, len(mixed)):
        torch.matmul(mixed[layer], rollout[layer - 1], out=rollout[layer])
    return rollout.numpy()


FLOW_SCALE = 2**30  # capacities in (0, 1] become integers (scipy's max-flow): a rounding of at most 5e-10 per edge


def attention_flow(
    run: AttentionRun, layer: int | None = None, max_tokens: int = MAX_FLOW_TOKENS, normalize: bool = True
) -> np.ndarray:
    """Attention flow, float32 ``[n, n]``: the maximum flow from token i after layer ``layer`` (default the
    last) to input token j, in the graph whose edges from layer l+1 down to layer l have the capacities
    A_l of ``residual_attention``.

    ``normalize`` (default): each row divided by its sum, so row i is a distribution over the input tokens,
    comparable with rollout's rows; this is what the authors' released code does (``compute_flows`` in
    github.com/samiraabnar/attention_flow divides each node's flow values by their sum). ``normalize=False``:
    the raw max-flow values, each at most 1 (the capacity of a token's row).

    One max-flow problem per (i, j), solved by ``scipy.sparse.csgraph.maximum_flow`` on integer
    capacities (the tests compare it with networkx's max-flow on the same graph).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    n, num_layers = run.num_tokens, run.num_layers
    last = num_layers - 1 if layer is None else int(layer)
    if not 0 <= last < num_layers:
        raise HeadscopeError(f"layer {layer} is out of range: this model has layers 0 to {num_layers - 1}.")
    if n > max_tokens:
        raise HeadscopeError(
            f"Attention flow solves {n} x {n} max-flow problems; {n} tokens is more than the {max_tokens} "
            "it allows. Use a shorter text, or attention rollout."
        )
    graph = flow_graph(run, last)
    capacities = csr_matrix(
        (np.rint(graph["capacity"] * FLOW_SCALE).astype(np.int32), (graph["source"], graph["target"])),
        shape=(graph["nodes"], graph["nodes"]),
    )
    flow = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(n):
            flow[i, j] = maximum_flow(capacities, (last + 1) * n + i, j).flow_value / FLOW_SCALE
    if normalize:
        totals = flow.sum(axis=-1, keepdims=True)  # positive: the residual half keeps every token's own path
        flow = flow / np.where(totals > 0, totals, 1.0)
    return flow.astype(np.float32)


def flow_graph(run: AttentionRun, last: int) -> dict:
    """The layered graph of attention flow up to layer ``last``: node ``level * n + i`` is token i after
    ``level`` layers (level 0: the input); an edge from ``(level + 1, i)`` to ``(level, j)`` for every
    positive A_level[i, j], with that capacity. ``{"source", "target", "capacity", "nodes"}``."""
    n = run.num_tokens
    mixed = residual_attention(run)[: last + 1].astype(np.float64)
    level, i, j = np.nonzero(mixed > 0)
    return {
        "source": (level + 1) * n + i,
        "target": level * n + j,
        "capacity": mixed[level, i, j],
        "nodes": (last + 2) * n,
    }


# ---- norm-based attention ---------------------------------------------------------------------------------
def transformed_values(vectors: core_engine.HeadVectors) -> torch.Tensor:
    """f_h(x_j) = v_h(x_j) W_O^h for every head and token: ``[batch, heads, n, d_model]``."""
    return torch.matmul(vectors.value, _per_head_output(vectors))


def _per_head_output(vectors: core_engine.HeadVectors) -> torch.Tensor:
    """W_O^h of every head, ``[heads, d_v, d_model]`` (row vectors v times it give f_h)."""
    heads, d_v = vectors.value.shape[1], vectors.value.shape[-1]
    return vectors.output_weight.view(-1, heads, d_v).permute(1, 2, 0)


_GRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _output_grams(hf_model, layer: int, vectors: core_engine.HeadVectors) -> torch.Tensor:
    """G_h = W_O^h (W_O^h)^T, ``[heads, d_v, d_v]``, so that ||v W_O^h||^2 = v G_h v^T (cached per model)."""
    grams = _GRAMS.setdefault(hf_model, {})
    if layer not in grams:
        per_head = _per_head_output(vectors)
        grams[layer] = torch.matmul(per_head, per_head.transpose(1, 2))
    return grams[layer]


def _norms_through(vectors: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||u W_O^h|| for row vectors u ``[B, H, n, d_v]``: sqrt(u G_h u^T), without forming u W_O^h."""
    squared = (torch.matmul(vectors, gram) * vectors).sum(dim=-1)
    return squared.clamp(min=0).sqrt()


def norm_based_attention(
    hf_model, attentions: torch.Tensor, layer_inputs: list[torch.Tensor]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(norms [B, L, H, n, n], value_norms [B, L, H, n], output_norms [B, L, H, n])``, float32.

    norms[l, h, i, j] = ||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)|| (alpha >= 0);
    value_norms = ||f_h(x_j)||; output_norms = ||sum_j alpha_ij f_h(x_j)|| (the head's output for token i).
    ``attentions`` are the weights of the same pass whose ``layer_inputs`` are given. Norms go through
    the Gram matrix of each head's output projection, so no d_model-wide vector is formed per token.
    """
    batch, num_layers, heads, n, _ = attentions.shape
    if len(layer_inputs) != num_layers:
        raise HeadscopeError(f"{len(layer_inputs)} layer inputs for {num_layers} layers.")
    norms = np.empty((batch, num_layers, heads, n, n), dtype=np.float32)
    value_norms = np.empty((batch, num_layers, heads, n), dtype=np.float32)
    output_norms = np.empty((batch, num_layers, heads, n), dtype=np.float32)
    with torch.inference_mode():
        for layer, x in enumerate(layer_inputs):
            vectors = core_engine.head_vectors(hf_model, layer, x, values_only=True)
            gram = _output_grams(hf_model, layer, vectors)
            weights = attentions[:, layer].to(vectors.value.dtype)
            size = _norms_through(vectors.value, gram)  # [B, H, n]
            torch.mul(weights, size[:, :, None, :], out=torch.from_numpy(norms[:, layer]))
            value_norms[:, layer] = size.numpy()
            output_norms[:, layer] = _norms_through(torch.matmul(weights, vectors.value), gram).numpy()
    return norms, value_norms, output_norms


# ---- the neuron view ------------------------------------------------------------------------------------
@dataclass
class NeuronView:
    """One head, one query token: how its score with every key token is made.

    query [d_k]; keys, products [n, d_k] (products = query * key, elementwise); dot [n] = products summed;
    scaled [n] = dot / sqrt(d_k) (or dot itself for heads without scaling); bias [n] (MPNet's relative
    position bias, else 0); scores = scaled + bias; weights = softmax of the scores over the visible keys;
    attention = the model's own attention row, for comparison. ``rotated``: the vectors are after the
    rotary position rotation (Llama, SmolLM2), as the score sees them.
    """

    tokens: list[str]
    layer: int
    head: int
    query_index: int
    query: np.ndarray
    keys: np.ndarray
    products: np.ndarray
    dot: np.ndarray
    scaled: np.ndarray
    bias: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    attention: np.ndarray
    visible: np.ndarray
    rotated: bool
    score: str
    engine: str


def neuron_view(
    model, text_or_ids, layer: int, head: int, query_index: int, engine: str = "transformers"
) -> NeuronView:
    """The neuron view of head (``layer``, ``head``) for one query token of a text (or a list of token ids)."""
    if isinstance(text_or_ids, str):
        token_ids = model.encode(text_or_ids).input_ids
    else:
        token_ids = [int(i) for i in text_or_ids]
    if not 0 <= layer < model.num_layers or not 0 <= head < model.num_heads:
        raise HeadscopeError(
            f"No head ({layer}, {head}): this model has layers 0 to {model.num_layers - 1} "
            f"and heads 0 to {model.num_heads - 1}."
        )
    if not 0 <= query_index < len(token_ids):
        raise HeadscopeError(f"No token {query_index}: the text has tokens 0 to {len(token_ids) - 1}.")
    attentions, inputs = model.layer_inputs(token_ids, engine)
    vectors = core_engine.head_vectors(model.hf_model, layer, inputs[layer])
    query = vectors.query[0, head, query_index]
    keys = vectors.key[0, head]
    products = query[None, :] * keys
    dot = products.sum(dim=-1)
    scaled = dot / math.sqrt(query.shape[-1]) if vectors.score == "scaled" else dot
    n = keys.shape[0]
    bias = vectors.score_bias[0, head, query_index] if vectors.score_bias is not None else torch.zeros(n)
    scores = scaled + bias
    visible = torch.arange(n) <= query_index if vectors.causal else torch.ones(n, dtype=torch.bool)
    weights = masked_softmax(scores, visible)
    encoded = model.encoder.encode_ids(token_ids, model.hf_model.get_input_embeddings().num_embeddings)
    tokens = model.display.display(encoded.raw_tokens, encoded.word_ids)
    as_numpy = lambda t: t.detach().float().numpy().copy()  # noqa: E731
    return NeuronView(
        tokens=tokens,
        layer=layer,
        head=head,
        query_index=query_index,
        query=as_numpy(query),
        keys=as_numpy(keys),
        products=as_numpy(products),
        dot=as_numpy(dot),
        scaled=as_numpy(scaled),
        bias=as_numpy(bias),
        scores=as_numpy(scores),
        weights=as_numpy(weights),
        attention=as_numpy(attentions[0, layer, head, query_index]),
        visible=visible.numpy(),
        rotated=core_engine.core_model(model.hf_model).rope is not None,
        score=vectors.score,
        engine=engine,
    )
