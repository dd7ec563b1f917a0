"""What a decoder's residual stream says about one prediction (``mha_core.interventions``, docs/circuits.md):
direct logit attribution, activation patching and the logit lens, each on prompts tokenized once (``prompt``)."""

from __future__ import annotations

from ..interventions.attribution import logit_attribution
from ..interventions.logit_lens import logit_lens
from ..interventions.patching import DEFAULT_BATCH_SIZE, DEFAULT_EXACT_TOP, patch
from ..interventions.readout import encoded_prompt
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, LIGHT, Operation, operation


def prompt(model, text: str, what: str = "prompt") -> EncodedText:
    """A prompt tokenized once as ``model.run`` does (``readout.encoded_prompt``: a clear error for an empty prompt
    or one longer than the model takes), for every operation of this module to read."""
    return encoded_prompt(model, text, what)


def pass_bytes(model, rows: int, tokens: int, kept_layers: int = 0, backward: bool = False) -> int:
    """What one pass of ``rows`` copies of a ``tokens``-token prompt holds at its peak: one layer's activations
    (residual, q/k/v/o, the MLP's hidden units, the attention scores and weights) per row, ``kept_layers``
    recorded per-layer outputs ``[tokens, d]`` per row, and the last position's logits. With ``backward``
    every layer's activations stay for the backward pass."""
    config = model.hf_model.config
    d_model = getattr(config, "hidden_size", None) or config.n_embd
    d_mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d_model
    vocab = vocabulary_size(model)
    layer = tokens * (6 * d_model + 3 * d_mlp) + 2 * model.num_heads * tokens * tokens
    held = layer * (model.num_layers if backward else 1) + kept_layers * tokens * d_model
    return FLOAT_BYTES * rows * (held + vocab)


def vocabulary_size(model) -> int:
    return int(model.lm_model.get_output_embeddings().weight.shape[0])


@operation
class Attribution(Operation):
    """Direct logit attribution at ``position`` (``mha_core.logit_attribution``): every head's, MLP's and the
    embeddings' share of the logit of ``answer`` over ``foil``'s."""

    work_class = LIGHT
    model: str
    prompt: EncodedText
    answer: str | int
    foil: str | int | None = None
    position: int = -1

    def peak_bytes(self, model) -> int:
        """One pass keeping every head's, MLP's and block's output."""
        return pass_bytes(model, 1, len(self.prompt), kept_layers=3 * model.num_layers + 1)

    def run(self, model, progress: Progress | None = None):
        return logit_attribution(model, self.prompt, self.answer, self.foil, position=self.position, progress=progress)


@operation
class Patching(Operation):
    """Activation patching from the ``clean`` prompt into the ``corrupted`` one over heads, layers or positions
    (``mha_core.patch``), exactly or by attribution with the exact scores of its ``exact_top`` components."""

    work_class = HEAVY
    model: str
    clean: EncodedText
    corrupted: EncodedText
    answer: str | int
    foil: str | int
    over: str = "heads"
    method: str = "exact"
    batch_size: int = DEFAULT_BATCH_SIZE
    exact_top: int = DEFAULT_EXACT_TOP
    engine: str = "transformers"

    def peak_bytes(self, model) -> int:
        """Both prompts' recorded outputs, and one batch of patched passes (or the backward pass)."""
        tokens = len(self.clean)
        recorded = 2 * 3 * model.num_layers  # both prompts' head, MLP and block outputs
        batch = pass_bytes(model, self.batch_size, tokens)
        if self.method == "attribution":
            batch = max(batch, pass_bytes(model, 1, tokens, backward=True))
        return pass_bytes(model, 1, tokens, kept_layers=recorded) + batch

    def run(self, model, progress: Progress | None = None):
        return patch(
            model,
            self.clean,
            self.corrupted,
            self.answer,
            self.foil,
            over=self.over,
            method=self.method,
            batch_size=self.batch_size,
            exact_top=self.exact_top,
            progress=progress,
            engine=self.engine,
        )


@operation
class LogitLens(Operation):
    """The top ``k`` next tokens after every layer at every position (``mha_core.logit_lens``)."""

    work_class = LIGHT
    model: str
    prompt: EncodedText
    k: int = 5

    def peak_bytes(self, model) -> int:
        """The pass, every block's output, then one layer's logits over the vocabulary."""
        tokens = len(self.prompt)
        kept = pass_bytes(model, 1, tokens, kept_layers=model.num_layers)
        return kept + 2 * FLOAT_BYTES * tokens * vocabulary_size(model)

    def run(self, model, progress: Progress | None = None):
        return logit_lens(model, self.prompt, k=self.k, progress=progress)
