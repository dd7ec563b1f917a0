"""Which heads, and the hook functions that ablate them (zero or mean), for either engine.

Head h of layer l contributes Concat(head_1, ..., head_H) W^O through its slice ``[h * d_k, (h + 1) * d_k)``
of the output projection's input (``o_proj`` / ``attention.output.dense`` / ``c_proj`` / ``attn.o``, declared per
family in ``mha_core.engine``): the named point ``blocks.{l}.attn.hook_z``. An ablation is an edit there
(``mha_core.edits``): zero ablation sets a head's output to 0; mean ablation replaces it by its mean over a
reference set of texts (``head_means``).

``model`` is a ``LoadedModel`` (``models.loaded``, which imports this module, so it is not imported here).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from ..analysis.syntax import ud_ewt_dev
from ..edits import replace_heads, zero_heads
from ..errors import HeadscopeError
from ..hooks import block_point
from .outputs import padded

ABLATIONS = ("zero", "mean")


# Mean ablation replaces a head's output by its mean over these texts: the first sentences of the shipped
# UD English EWT dev split (a stated, fixed reference, so two runs ablate with the same values).
MEAN_REFERENCE_SENTENCES = 32


class AblationError(HeadscopeError, ValueError):
    """A bad ablation request: a head that does not exist, an unknown ablation kind."""


# ---- which heads, and the edits that ablate them ----------------------------------------------------
def check_heads(model, heads) -> list[tuple[int, int]]:
    """``[(layer, head), ...]`` validated against the model, duplicates removed, in the given order."""
    checked: list[tuple[int, int]] = []
    for item in heads or ():
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise AblationError(f"Name each head as (layer, head), got {item!r}.") from None
        if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
            raise AblationError(
                f"Head ({layer}, {head}) does not exist: {model.name!r} has layers 0-{model.num_layers - 1} "
                f"and heads 0-{model.num_heads - 1}."
            )
        if (layer, head) not in checked:
            checked.append((layer, head))
    return checked


def reference_texts(count: int = MEAN_REFERENCE_SENTENCES) -> list[str]:
    """The texts mean ablation averages over (``MEAN_REFERENCE_SENTENCES`` UD EWT dev sentences)."""
    return [" ".join(sentence.words) for sentence in ud_ewt_dev(count)]


def z_point(layer: int) -> str:
    """The named point of layer ``layer``'s heads' outputs, z ``[batch, n, heads, d_head]``."""
    return block_point(layer, "attn.hook_z")


def head_means(model, texts: Sequence[str] | None = None, batch_size: int = 16) -> torch.Tensor:
    """Each layer's Concat(heads) averaged over every real token of ``texts``: float32 ``[layers, width]``.

    ``texts`` default to ``reference_texts()``. Cached on the model per reference set.
    """
    texts = tuple(reference_texts() if texts is None else texts)
    if not texts:
        raise AblationError("Mean ablation needs at least one reference text.")
    cached = model.head_means_cache.get(texts)
    if cached is not None:
        return cached
    sums: list[torch.Tensor | None] = [None] * model.num_layers
    count = 0
    current: dict = {}  # this batch's attention mask

    def summing(layer: int):
        def hook(z: torch.Tensor) -> None:  # records, leaves z as it is
            concat = z.float().reshape(*z.shape[:2], -1)
            weights = current["mask"][..., None].to(concat.dtype)
            total = (concat * weights).sum(dim=(0, 1))
            sums[layer] = total if sums[layer] is None else sums[layer] + total

        return hook

    encoded = [model.encode(text) for text in texts]
    hooks = {z_point(layer): summing(layer) for layer in range(model.num_layers)}
    for start in range(0, len(encoded), batch_size):
        forward = padded(model, encoded[start : start + batch_size])
        current["mask"] = forward.attention_mask
        count += int(forward.attention_mask.sum())
        model.run_pass(forward.with_changes(hooks=hooks, attentions=False))
    means = torch.stack([total / count for total in sums])
    model.head_means_cache[texts] = means
    return means


def ablation_hooks(model, heads, ablation: str = "zero", reference: Sequence[str] | None = None) -> dict | None:
    """``{"blocks.{l}.attn.hook_z": edit}`` that ablate ``heads`` (zero or mean), for either engine; None when there
    are none."""
    if ablation not in ABLATIONS:
        raise AblationError(f"Unknown ablation {ablation!r}: use one of {', '.join(ABLATIONS)}.")
    heads = check_heads(model, heads)
    if not heads:
        return None
    model.output_projections()  # a clear error for a model whose heads' outputs Headscope cannot reach
    means = head_means(model, reference) if ablation == "mean" else None
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    if means is None:
        return {z_point(layer): zero_heads(layer_heads) for layer, layer_heads in by_layer.items()}
    return {
        z_point(layer): replace_heads(layer_heads, means[layer].reshape(model.num_heads, -1))
        for layer, layer_heads in by_layer.items()
    }


# ---- small helpers shared by the command line and the app -----------------------------------------
_HEAD_NAME = re.compile(r"(?:[Ll](\d{1,6})[Hh](\d{1,6}))|(?:(\d{1,6})[.:/](\d{1,6}))")


def split_heads(
    spec: str, num_layers: int | None = None, num_heads: int | None = None
) -> tuple[list[tuple[int, int]], list[str]]:
    """``"3.2, L20H5, zzz"`` -> ``([(3, 2), (20, 5)], ["zzz"])``: the heads named as layer.head (3.2) or L3H2, each
    once, in the given order, and the items refused, as written: those that name no head, and with
    ``num_layers`` / ``num_heads`` those that name a head the model does not have."""
    heads, refused = [], []
    for item in re.split(r"[\s,;]+", str(spec).strip()):
        if not item:
            continue
        match = _HEAD_NAME.fullmatch(item)
        numbers = [int(g) for g in match.groups() if g is not None] if match else []
        layer, head = numbers if numbers else (-1, -1)
        if (
            not numbers
            or (num_layers is not None and layer >= num_layers)
            or (num_heads is not None and head >= num_heads)
        ):
            refused.append(item)
        elif (layer, head) not in heads:
            heads.append((layer, head))
    return heads, refused


def refused_heads_message(refused: Sequence[str], num_layers: int | None = None, num_heads: int | None = None) -> str:
    """What is wrong with the items ``split_heads`` refused, naming each (at most ten)."""
    names = ", ".join(repr(item[:20]) for item in refused[:10]) + (", ..." if len(refused) > 10 else "")
    sizes = (
        f" (this model has layers 0 to {num_layers - 1} and heads 0 to {num_heads - 1})"
        if num_layers is not None and num_heads is not None
        else ""
    )
    return f"{names} name{'s' if len(refused) == 1 else ''} no head{sizes}: name heads as layer.head (3.2) or L3H2"


def parse_heads(spec: str, num_layers: int | None = None, num_heads: int | None = None) -> list[tuple[int, int]]:
    """``"3.2, 20.5"`` or ``"L3H2 L20H5"`` -> ``[(3, 2), (20, 5)]``; ``AblationError`` naming every item refused
    (``split_heads``: with the model's sizes, heads it does not have too)."""
    heads, refused = split_heads(spec, num_layers, num_heads)
    if refused:
        raise AblationError(refused_heads_message(refused, num_layers, num_heads) + ".")
    return heads
