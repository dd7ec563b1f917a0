"""The one registry of model families: every family module's ``FAMILY``, by name and by model type.

Models, the engine and the app all read this table; adding a family is one module (``engine/<name>.py``
with its ``FAMILY``) and one line here. A model type that no family covers still loads and runs with the
transformers engine; its family name is then its model type, and the from-scratch engine says it cannot
replay it.
"""

from __future__ import annotations

from . import bart, bert, gpt2, llama, mpnet, t5
from .family import Family

FAMILIES: dict[str, Family] = {
    family.name: family for family in (bert.FAMILY, mpnet.FAMILY, gpt2.FAMILY, llama.FAMILY, t5.FAMILY, bart.FAMILY)
}

FAMILY_OF_MODEL_TYPE: dict[str, Family] = {
    model_type: family for family in FAMILIES.values() for model_type in family.model_types
}


def family_name(model_type: str) -> str:
    """The family a model type belongs to; an uncovered type is its own family."""
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    return family.name if family is not None else model_type


def supported_types() -> str:
    """``"bert: bert, roberta, ...; gpt2: gpt2; ..."`` for messages."""
    return "; ".join(f"{family.name}: {', '.join(family.model_types)}" for family in FAMILIES.values())


def head_class_name(model_type: str) -> str | None:
    """The transformers auto class that loads a model type with its LM head, or None (no head known)."""
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None or family.lm_head is None or model_type in family.types_without_head:
        return None
    return {"causal": "AutoModelForCausalLM", "masked": "AutoModelForMaskedLM"}[family.lm_head]
