"""The Circuits page's computations (``mha_core.interventions``: logit attribution, patching, the logit lens), each
through the app's one gated, budgeted path (``state.cached`` with the bytes it holds at its peak reserved, in a
compute slot), cached per model and prompt.
"""

from __future__ import annotations

from mha_core.interventions.attribution import logit_attribution
from mha_core.interventions.logit_lens import logit_lens
from mha_core.interventions.patching import DEFAULT_BATCH_SIZE, patch
from mha_core.interventions.readout import CircuitError, prompt_ids
from ui import state

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


def attribution(model_name: str, text: str, answer: str, foil: str):
    """``mha_core.logit_attribution`` of the last position, cached."""
    model = state.get_model(model_name)
    tokens = check_prompt(model, text, "clean prompt")
    key = ("circuits-attribution", state.model_key(model_name), text, answer, foil)
    check = state.stop_point()

    def compute():
        return state.in_slot(lambda: logit_attribution(model, text, answer, foil, progress=check), check)

    reserve = pass_bytes(model, 1, tokens, kept_layers=3 * model.num_layers + 1)
    return state.cached(key, compute, check, reserve_bytes=reserve)


def patching(model_name: str, clean: str, corrupted: str, answer: str, foil: str, method: str):
    """``mha_core.patch`` over heads (exact, or attribution with the exact scores of its top heads), cached."""
    model = state.get_model(model_name)
    tokens = check_prompt(model, clean, "clean prompt")
    check_prompt(model, corrupted, "corrupted prompt")
    key = ("circuits-patching", state.model_key(model_name), clean, corrupted, answer, foil, method)
    check = state.stop_point()

    def compute():
        return state.in_slot(
            lambda: patch(
                model, clean, corrupted, answer, foil, over="heads", method=method, exact_top=EXACT_TOP, progress=check
            ),
            check,
        )

    recorded = 2 * 3 * model.num_layers  # both prompts' head, MLP and block outputs
    batch = pass_bytes(model, DEFAULT_BATCH_SIZE, tokens)
    if method == "attribution":
        batch = max(batch, pass_bytes(model, 1, tokens, backward=True))
    reserve = pass_bytes(model, 1, tokens, kept_layers=recorded) + batch
    return state.cached(key, compute, check, reserve_bytes=reserve)


def lens(model_name: str, text: str, k: int = LENS_TOP_K):
    """``mha_core.logit_lens`` of the prompt, cached."""
    model = state.get_model(model_name)
    tokens = check_prompt(model, text, "clean prompt")
    key = ("circuits-lens", state.model_key(model_name), text, k)
    check = state.stop_point()

    def compute():
        return state.in_slot(lambda: logit_lens(model, text, k=k, progress=check), check)

    vocab = model.lm_model.get_output_embeddings().weight.shape[0]
    # The pass, every block's output, then one layer's logits over the whole vocabulary at a time.
    reserve = pass_bytes(model, 1, tokens, kept_layers=model.num_layers) + 2 * FLOAT_BYTES * tokens * vocab
    return state.cached(key, compute, check, reserve_bytes=reserve)
