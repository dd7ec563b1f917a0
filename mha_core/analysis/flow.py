"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"):
what each token's representation after layer l draws on from the input tokens, with the residual connection
counted as half of every layer."""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from ..errors import HeadscopeError
from ..run import AttentionRun

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
    return rollout_product(residual_attention(run))


def rollout_product(mixed: np.ndarray) -> np.ndarray:
    """The rollout of per-layer mixing matrices ``[L, n, n]`` (any float dtype, kept): R_0 = M_0 and
    R_l = M_l @ R_(l-1). Attention rollout's matrices carry the residual connection (``residual_attention``);
    value zeroing's have it inside (``interventions.value_zeroing``)."""
    mixed = torch.from_numpy(np.ascontiguousarray(mixed))
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
