"""The Compare page's settings (``CompareSettings``, declared once: ``ui.page_settings``) and its logic: the
second model offered first, and the words that name each side. ``pages/compare.py`` draws them."""

from __future__ import annotations

from dataclasses import dataclass

from mha_core.models import DEFAULT_MODEL, ENGINES
from ui.page_settings import PageSettings, setting
from ui.settings import ENGINE_LABELS, OTHER_MODEL, model_choices
from ui.widgets.views import PAIRINGS

MODES = {"layers": "Layer vs layer", "sentences": "Sentence vs sentence", "models": "Model vs model"}
SECOND_SENTENCE = "The cat sat on the mat because it was hungry."


@dataclass(frozen=True)
class CompareSettings(PageSettings):
    """Every setting of the Compare page. The difference toggle is one per mode (its session key names the
    mode's view); the second model's choices are the models this server offers; the layers' ranges follow
    the models."""

    mode: str = setting("compare_mode", "compare", "choice", "layers", label="Compare", options=MODES)
    difference: bool = setting(
        "{view}_difference",
        "diff",
        "flag",
        False,
        label="Show the difference (left − right)",
        help="Below the two layers, one map of left minus right: red where the left attends more, blue where the "
        "right does. Position by position where the two have the same tokens or one tokenizer and one length; word "
        "by word for one text through two tokenizers.",
    )
    other_text: str = setting("compare_text", "text2", "text", SECOND_SENTENCE, label="Second sentence to compare")
    other_model: str = setting("compare_model", "model2", "choice", None, label="Second model")
    other_engine: str = setting(
        "compare_engine",
        "engine2",
        "choice",
        ENGINES[0],
        label="Second engine",
        options={engine: ENGINE_LABELS[engine] for engine in ENGINES},
    )
    pairing: str = setting("compare_pairing", "pair", "choice", "depth", label="Pair the layers", options=PAIRINGS)
    other_layer: int = setting("compare_other_layer", "layer2", "layer", 0, label="Layer of {model}")
    right_layer: int = setting("compare_layer_b", "right_layer", "layer", None, label="Right layer")
    left_layer: int = setting("layer", "layer", "layer", 0, label="Left layer")


def second_models() -> dict[str, str]:
    """The models the second side may be: those this server offers by name (no "other")."""
    return {key: label for key, label in model_choices().items() if key != OTHER_MODEL}


def second_model_default(model: str, offered: dict[str, str]) -> str:
    """The second model offered first: another model than the sidebar's default one when there is one."""
    return list(offered)[1 if model == DEFAULT_MODEL and len(offered) > 1 else 0]
