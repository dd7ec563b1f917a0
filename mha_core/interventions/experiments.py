"""Experiments that run a model under interventions: the decoder scores on repeated random tokens, the induction
experiment (TransformerLens's test), and named groups of heads ablated against random groups of the same size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..analysis.roles import DECODER_SCORES, decoder_scores_from_attention, repeated_random_tokens
from ..errors import HeadscopeError
from ..models.ablation import AblationError, ablation_hooks, check_heads
from ..models.forward import ForwardPass
from ..models.outputs import next_token_losses
from ..progress import Progress, report
from ..run import per_head_frame
from .importance import LossProbe

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel


def decoder_head_scores(
    model: LoadedModel, seq_len: int = 20, repeats: int = 2, batch: int = 4, seed: int = 0
) -> pd.DataFrame:
    """Previous-token, duplicate-token, induction and prefix-matching scores of every head, averaged
    over ``batch`` sequences of ``seq_len`` random tokens repeated ``repeats`` times (a BOS first when
    the tokenizer has one, as TransformerLens does)."""
    if repeats < 2:
        raise HeadscopeError("repeats must be at least 2: induction needs an earlier copy")
    tokenizer = model.tokenizer
    vocab_size = len(tokenizer)
    bos_id = getattr(tokenizer, "bos_token_id", None) if getattr(model, "is_causal", True) else None
    sequences = repeated_random_tokens(
        vocab_size, seq_len, repeats, batch, seed, excluded_ids=getattr(tokenizer, "all_special_ids", []), bos_id=bos_id
    )
    scores: dict[str, list[np.ndarray]] = {name: [] for name in DECODER_SCORES}
    uniform: dict[str, list[float]] = {name: [] for name in DECODER_SCORES}
    for ids in sequences:
        run = model.run_ids(ids.tolist())
        for name, value in decoder_scores_from_attention(run.attentions, ids).items():
            scores[name].append(value)
        # What attention spread evenly over the visible keys would score: each score's chance level.
        n = len(ids)
        even = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
        for name, value in decoder_scores_from_attention(even[None, None], ids).items():
            uniform[name].append(float(value[0, 0]))
    num_layers, num_heads = scores["previous_token"][0].shape
    stacked = {name: np.stack(scores[name]) for name in DECODER_SCORES}  # [sequences, L, H] each
    columns = {name: stacked[name].mean(axis=0) for name in DECODER_SCORES}
    for name in DECODER_SCORES:
        columns[f"{name}_sd"] = (
            stacked[name].std(axis=0, ddof=1) if len(sequences) > 1 else np.full((num_layers, num_heads), np.nan)
        )
        columns[f"{name}_uniform"] = float(np.nanmean(uniform[name]))
    frame = per_head_frame(num_layers, num_heads, **columns, num_sequences=len(sequences))
    frame.attrs["repeats"] = repeats
    return frame


# ---- the induction experiment ---------------------------------------------------------------------
def induction_experiment(
    model: LoadedModel,
    top_k: int = 5,
    role: str = "induction",
    random_draws: int = 4,
    seq_len: int = 50,
    batch: int = 8,
    seed: int = 0,
    scores: pd.DataFrame | None = None,
    ablation: str = "zero",
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Repeated random tokens (TransformerLens's test): the loss on the repeated half with no head ablated,
    with the ``top_k`` heads of ``role`` ablated, and with ``top_k`` random heads ablated (``random_draws``
    draws: the control). ``batch`` sequences of BOS + ``seq_len`` tokens + the same ``seq_len`` again.

    Returns one row per condition: ``condition, draw, heads, loss_first_half, loss_repeated_half``.
    Decoders with a causal LM head only.
    """
    if model.lm_head_kind != "causal":
        raise AblationError(
            f"The induction experiment measures next-token loss: {model.name!r} has {model.head_description}."
        )
    if role not in DECODER_SCORES:
        raise AblationError(f"Unknown role score {role!r}: use one of {', '.join(DECODER_SCORES)}.")
    total_heads = model.num_layers * model.num_heads
    if not 1 <= top_k <= total_heads:
        raise AblationError(f"top_k must be between 1 and {total_heads}, got {top_k}")
    if scores is None:
        scores = decoder_head_scores(model)
    ranked = scores.sort_values(role, ascending=False, kind="stable")
    top = list(zip(ranked["layer"].astype(int)[:top_k], ranked["head"].astype(int)[:top_k]))
    rng = np.random.default_rng(seed)
    conditions = [("none", 0, []), (f"top {top_k} {role}", 0, top)]
    for draw in range(random_draws):
        picks = rng.choice(total_heads, size=top_k, replace=False)
        conditions.append(
            (f"{top_k} random", draw, [(int(p) // model.num_heads, int(p) % model.num_heads) for p in picks])
        )
    tokenizer = model.tokenizer
    ids = torch.as_tensor(
        repeated_random_tokens(
            vocab_size=len(tokenizer),
            seq_len=seq_len,
            repeats=2,
            batch=batch,
            seed=seed,
            excluded_ids=tokenizer.all_special_ids,
            bos_id=model.encoder.bos_token_id,
        )
    )
    offset = ids.shape[1] - 2 * seq_len  # 1 with a BOS
    rows = []
    for index, (name, draw, heads) in enumerate(conditions):
        hidden = model.hidden_states(ForwardPass(ids, hooks=ablation_hooks(model, heads, ablation)))
        with torch.inference_mode():
            losses = next_token_losses(model.logits(hidden), ids)  # loss i predicts token i + 1
        first = losses[:, offset : offset + seq_len - 1].mean()
        repeated = losses[:, offset + seq_len - 1 :].mean()
        rows.append(
            dict(
                condition=name,
                draw=draw,
                heads=" ".join(f"L{layer}H{head}" for layer, head in heads) or "-",
                loss_first_half=float(first),
                loss_repeated_half=float(repeated),
            )
        )
        report(progress, index + 1, len(conditions), f"condition {index + 1} of {len(conditions)}: {name}")
    frame = pd.DataFrame(rows)
    frame.attrs.update(role=role, top_k=top_k, ablation=ablation, sequences=batch, seq_len=seq_len)
    return frame


def summarize_experiment(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per condition kind: mean and spread (sd over draws) of the repeated-half loss."""
    grouped = frame.groupby("condition", sort=False)["loss_repeated_half"]
    summary = grouped.agg(["mean", "std", "count"]).reset_index()
    summary["std"] = summary["std"].fillna(0.0)
    return summary.rename(columns={"mean": "loss_repeated_half", "std": "sd", "count": "draws"})


def role_group_ablation(model: LoadedModel, text: str, primary: pd.DataFrame, ablation: str = "zero") -> pd.DataFrame:
    """For each role group in ``primary`` (``mha_core.primary_roles``: layer, head, group): the loss (or
    output change) of ``text`` with all heads of that group ablated at once, against no ablation.

    Returns ``group, heads, measure, before, after, change``, the largest change first.
    """
    probe = LossProbe(model, [text])
    before = probe()
    rows = []
    for group, part in primary.groupby("group", sort=False):
        if group == "none":
            continue
        heads = list(zip(part["layer"].astype(int), part["head"].astype(int)))
        after = probe(ablation_hooks(model, heads, ablation))
        rows.append(dict(group=group, heads=len(heads), measure=probe.measure, before=before, after=after))
    frame = pd.DataFrame(rows, columns=["group", "heads", "measure", "before", "after"])
    frame["change"] = frame["after"] - frame["before"]
    return frame.sort_values("change", ascending=False, kind="stable").reset_index(drop=True)


# ---- which roles are causal: named groups of heads against random groups of the same size -------------
def head_groups(
    table: pd.DataFrame, role_column: str | None = None, score_columns: Sequence[str] = (), top_k: int = 5
) -> dict[str, list[tuple[int, int]]]:
    """Named groups of heads from a per-head table (``layer, head, ...``): every value of ``role_column``
    (e.g. a profile's ``primary_role``; "none" and empty skipped), and the ``top_k`` heads of each score column."""
    groups: dict[str, list[tuple[int, int]]] = {}
    if role_column is not None:
        if role_column not in table.columns:
            raise HeadscopeError(f"the table has no column {role_column!r}")
        for role, part in table.groupby(role_column, sort=True):
            if str(role) in ("none", "nan", ""):
                continue
            groups[str(role)] = list(zip(part["layer"].astype(int), part["head"].astype(int)))
    for column in score_columns:
        if column not in table.columns:
            raise HeadscopeError(f"the table has no column {column!r}")
        ranked = table.sort_values(column, ascending=False, kind="stable").head(top_k)
        groups[f"top {top_k} {column}"] = list(zip(ranked["layer"].astype(int), ranked["head"].astype(int)))
    return groups


def group_ablation(
    model: LoadedModel,
    texts: Sequence[str],
    groups: dict[str, Sequence[tuple[int, int]]],
    draws: int = 4,
    seed: int = 0,
    ablation: str = "zero",
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Each named group of heads ablated at once, against ``draws`` random groups of the same size (the
    control): ``group, heads, measure, before, after, random_mean, random_sd, excess`` where excess =
    (after - before) / (random_mean - before), the group's effect in units of a random group's effect."""
    probe = LossProbe(model, texts)
    before = probe()
    rng = np.random.default_rng(seed)
    total = model.num_layers * model.num_heads
    rows = []
    for index, (name, heads) in enumerate(groups.items()):
        heads = check_heads(model, heads)
        after = probe(ablation_hooks(model, heads, ablation))
        randoms = []
        for _ in range(draws):
            picks = rng.choice(total, size=len(heads), replace=False)
            randoms.append(
                probe(
                    ablation_hooks(
                        model, [(int(p) // model.num_heads, int(p) % model.num_heads) for p in picks], ablation
                    )
                )
            )
        random_mean = float(np.mean(randoms)) if randoms else float("nan")
        rows.append(
            dict(
                group=name,
                heads=len(heads),
                measure=probe.measure,
                before=before,
                after=after,
                random_mean=random_mean,
                random_sd=float(np.std(randoms, ddof=1)) if len(randoms) > 1 else float("nan"),
                excess=(after - before) / (random_mean - before) if random_mean != before else float("nan"),
                head_list=" ".join(f"L{layer}H{head}" for layer, head in heads),
            )
        )
        report(progress, index + 1, len(groups), f"group {index + 1} of {len(groups)}: {name}")
    return pd.DataFrame(rows)
