"""The from-scratch engine: every layer of a checkpoint recomputed with Headscope's own code.

The weights come from a transformers model; the computation does not. Embeddings, LayerNorm,
RMSNorm, rotary positions, feed-forward networks and residual connections are written out
below, and every attention head is computed by ``mha_core.attention`` (``MultiHeadAttention``
for BERT and GPT-2, ``scaled_dot_product_attention`` for Llama's rotary, grouped-query heads).
The tests check that the weights equal ``transformers``' own (eager) attentions to 1e-4.

Per family, one module (``bert``, ``mpnet``, ``gpt2``, ``llama``; ``registry`` is the table of which model
types each covers): one function that reads a checkpoint's weights (``read_*``), one layer function (``*_layer``, what the app shows
as the code that ran) and one whole pass (``*_attentions``).
"""
