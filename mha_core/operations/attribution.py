"""Which input tokens one prediction depends on (``mha_core.token_attribution``, issue 33): the token scores of
every method, their faithfulness and their agreement, as one operation."""

from __future__ import annotations

from ..interventions.faithfulness import DEFAULT_SEEDS, explain
from ..interventions.token_attribution import BATCH_TOKENS, DEFAULT_STEPS, METHODS, step_batch
from ..interventions.value_zeroing import ZERO_BATCH
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, Operation, operation, pass_peak_bytes


def gradient_pass_bytes(model, rows: int, tokens: int) -> int:
    """A pass of ``rows`` sequences with its backward pass: every layer's activations (residual, q/k/v/o, the
    MLP's hidden units, the attention scores and weights) kept, and the last position's logits per row."""
    config = model.hf_model.config
    d_model = getattr(config, "hidden_size", None) or config.n_embd
    d_mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d_model
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    layer = tokens * (6 * d_model + 3 * d_mlp) + 2 * model.num_heads * tokens * tokens
    return 2 * FLOAT_BYTES * rows * (layer * model.num_layers + vocab)


@operation
class TokenAttribution(Operation):
    """One prediction explained (``faithfulness.explain``): the scores of ``methods`` for the ``target`` of the
    ``encoded`` text (a next token, or for a sentence encoder a second sentence), with the deletion and insertion
    curves of ``seeds`` random orders beside them (0: none) and the methods' agreement."""

    work_class = HEAVY
    model: str
    encoded: EncodedText
    target: str | int | None = None
    methods: tuple[str, ...] = METHODS
    steps: int = DEFAULT_STEPS
    seeds: int = DEFAULT_SEEDS

    @property
    def progress_label(self) -> str | None:
        return "Scoring the tokens"

    def peak_bytes(self, model) -> int:
        """The largest of a batch of integrated gradients' points with its backward pass, the curves' batch (every
        order's sequences of one length; a decoder's padded batches of up to ``BATCH_TOKENS`` tokens), value
        zeroing's batch of rows and the run with norm-based attention."""
        tokens = len(self.encoded)
        orders = len(self.methods) + self.seeds
        rows = max(2 * orders, -(-BATCH_TOKENS // max(tokens, 1)))
        curves = pass_peak_bytes(model.num_layers, model.num_heads, tokens, batch=rows)
        run = pass_peak_bytes(model.num_layers, model.num_heads, tokens, arrays=2)
        zeroing = pass_peak_bytes(model.num_layers, model.num_heads, tokens, batch=min(ZERO_BATCH, tokens))
        gradients = gradient_pass_bytes(model, step_batch(tokens, self.steps), tokens)
        return max(gradients, curves, run, zeroing)

    def run(self, model, progress: Progress | None = None):
        settings = dict(steps=self.steps, seeds=self.seeds, progress=progress)
        return explain(model, self.encoded, self.target, self.methods, **settings)
