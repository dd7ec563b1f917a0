"""The neuron view (BertViz's): for one head and one query token, the query vector, every key vector, their
elementwise products, the dot product, the scaled score and the softmax.

Query and key vectors come from ``engine.core.head_vectors`` applied to each layer's input hidden states of
the chosen engine's own pass, so both engines give them, for every family the registry covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..attention import masked_softmax
from ..engine.core import core_model, head_vectors
from ..errors import HeadscopeError


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
    vectors = head_vectors(model.hf_model, layer, inputs[layer])
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
        rotated=core_model(model.hf_model).rope is not None,
        score=vectors.score,
        engine=engine,
    )
