"""What the Circuits page checks before it computes (``mha_core.interventions``: logit attribution, patching, the
logit lens): the prompts' lengths. What each computation holds at its peak is its operation's
(``mha_core.operations.circuits``).
"""

from __future__ import annotations

import pandas as pd

from mha_core.interventions.readout import CircuitError, prompt_ids

# Patching runs the corrupted prompt once per head (270 times for SmolLM2): the page takes prompts up to this
# many tokens, so a run stays within seconds (the library and the command line take longer ones).
MAX_PAGE_TOKENS = 64
LENS_TOP_K = 3
EXACT_TOP = 10


def check_prompt(model, text, what: str) -> int:
    """The prompt's token count (a text, or one tokenized once: ``mha_core.operations.prompt``); a clear error for
    an empty prompt or one longer than the page takes."""
    count = len(prompt_ids(model, text, what))
    if count > MAX_PAGE_TOKENS:
        raise CircuitError(
            f"The {what} has {count} tokens; this page takes prompts of at most {MAX_PAGE_TOKENS} tokens (patching "
            "runs it once per head). Shorten it, or use the command line (python -m mha_core patch)."
        )
    return count


def prompt_tokens(model, text, what: str) -> list[str]:
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


def head_scores(attribution: pd.DataFrame, patched: pd.DataFrame) -> pd.DataFrame:
    """The page's two maps as one head table (a row per head): attribution's ``contribution`` beside patching's
    columns (``score``, and ``exact`` for the estimate), for the maps' file (``mha_core.views.tables``)."""
    heads = attribution[attribution["component"] == "head"][["layer", "head", "contribution"]].astype(
        {"layer": int, "head": int}
    )
    return heads.merge(patched.astype({"layer": int, "head": int}), on=["layer", "head"], how="outer")
