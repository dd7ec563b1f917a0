"""What the Circuits page checks before it computes (``mha_core.interventions``: logit attribution, patching, the
logit lens): the prompts' lengths, and the bytes each computation holds at its peak, which ``ui.compute``
reserves before it starts.
"""

from __future__ import annotations

import pandas as pd

from mha_core.interventions.patching import DEFAULT_BATCH_SIZE
from mha_core.interventions.readout import CircuitError, prompt_ids

# Patching runs the corrupted prompt once per head (270 times for SmolLM2): the page takes prompts up to this
# many tokens, so a run stays within seconds (the library and the command line take longer ones).
MAX_PAGE_TOKENS = 64
LENS_TOP_K = 3
EXACT_TOP = 10
FLOAT_BYTES = 4


def check_prompt(model, text: str, what: str) -> int:
    """The prompt's token count; a clear error for an empty prompt or one longer than the page takes."""
    count = len(prompt_ids(model, text, what))
    if count > MAX_PAGE_TOKENS:
        raise CircuitError(
            f"The {what} has {count} tokens; this page takes prompts of at most {MAX_PAGE_TOKENS} tokens (patching "
            "runs it once per head). Shorten it, or use the command line (python -m mha_core patch)."
        )
    return count


def prompt_tokens(model, text: str, what: str) -> list[str]:
    """The prompt's tokens as the head view shows them (``model.display``), after ``check_prompt``."""
    check_prompt(model, text, what)
    return model.display.display(model.tokenizer.convert_ids_to_tokens(prompt_ids(model, text, what)))


def token_table(clean: list[str], corrupted: list[str]) -> pd.DataFrame:
    """Both prompts' tokens side by side by position (an empty cell past the shorter one), and whether they
    differ there: where patching's two runs part."""
    length = max(len(clean), len(corrupted))
    padded = [tokens + [""] * (length - len(tokens)) for tokens in (clean, corrupted)]
    return pd.DataFrame(
        {
            "position": range(length),
            "clean": padded[0],
            "corrupted": padded[1],
            "differs": [a != b for a, b in zip(*padded)],
        }
    )


def pass_bytes(model, rows: int, tokens: int, kept_layers: int = 0, backward: bool = False) -> int:
    """What one pass of ``rows`` copies of a ``tokens``-token prompt holds at its peak: one layer's activations
    (residual, q/k/v/o, the MLP's hidden units, the attention scores and weights) per row, ``kept_layers``
    recorded per-layer outputs ``[tokens, d]`` per row, and the last position's logits. With ``backward``
    every layer's activations stay for the backward pass."""
    config = model.hf_model.config
    d_model = getattr(config, "hidden_size", None) or config.n_embd
    d_mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d_model
    vocab = model.lm_model.get_output_embeddings().weight.shape[0]
    layer = tokens * (6 * d_model + 3 * d_mlp) + 2 * model.num_heads * tokens * tokens
    held = layer * (model.num_layers if backward else 1) + kept_layers * tokens * d_model
    return FLOAT_BYTES * rows * (held + vocab)


def attribution_bytes(model, tokens: int) -> int:
    """Logit attribution's peak: one pass keeping every head's, MLP's and block's output."""
    return pass_bytes(model, 1, tokens, kept_layers=3 * model.num_layers + 1)


def patching_bytes(model, tokens: int, method: str) -> int:
    """Patching's peak: both prompts' recorded outputs, and one batch of patched passes (or the backward pass)."""
    recorded = 2 * 3 * model.num_layers  # both prompts' head, MLP and block outputs
    batch = pass_bytes(model, DEFAULT_BATCH_SIZE, tokens)
    if method == "attribution":
        batch = max(batch, pass_bytes(model, 1, tokens, backward=True))
    return pass_bytes(model, 1, tokens, kept_layers=recorded) + batch


def lens_bytes(model, tokens: int) -> int:
    """The logit lens's peak: the pass, every block's output, then one layer's logits over the vocabulary."""
    vocab = model.lm_model.get_output_embeddings().weight.shape[0]
    return pass_bytes(model, 1, tokens, kept_layers=model.num_layers) + 2 * FLOAT_BYTES * tokens * vocab
