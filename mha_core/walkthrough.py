"""The tutorial's worked example (course notes 000, section 3.2), computed for real: 4 tokens, d_model = 8, h = 2 heads, d_k = d_v = 4.

Every intermediate (Q_i, K_i, V_i, scores, softmax weights, head outputs, concat, output) comes from
``mha_core`` itself (``MultiHeadAttention.project``, ``attention_scores``, ``masked_softmax``, ...),
and the full ``MultiHeadAttention.forward`` must give the same output. Matrices use the tutorial's
layout: ``X @ W`` with W of shape ``[d_model, d_k]`` (an ``nn.Linear`` weight is its transpose).

The tutorial prints Q1, K1, V1 values that do not follow from its own X and W (e.g. Q1[0, 0] = 22.0,
but [1..8] @ W_1^Q[:, 0] = 0.1 * (1 + 4 + ... + 64) = 20.4), and its multiplication count omits the
weights @ V step. ``printed_discrepancies()`` lists each difference as data; the arithmetic wins.

W_2^K and W_2^V are not printed. Every printed matrix is a base row, a permutation of
[0.1, 0.2, 0.3, 0.4], plus 0.1 per row (W[r, c] = base[c] + 0.1 r), and head 1's key and value
matrices are its query matrix with the columns permuted: W_1^K = W_1^Q[:, (1, 0, 3, 2)] and
W_1^V = W_1^Q[:, (2, 3, 0, 1)]. We give head 2 the same relation to its printed W_2^Q:
W_2^K = W_2^Q[:, (1, 0, 3, 2)] and W_2^V = W_2^Q[:, (2, 3, 0, 1)]. The choice keeps the tutorial's
construction, is deterministic, and needs no random numbers that a class could not check by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .attention import SCORE_FUNCTIONS, MultiHeadAttention, attention_scores, causal_keep_mask, masked_softmax


def _tutorial_pattern(base_row) -> np.ndarray:
    """W[r, c] = base_row[c] + 0.1 r for r in 0..7: the construction of every matrix the tutorial prints."""
    rows = np.arange(8, dtype=np.float64)[:, None]
    return np.round(np.asarray(base_row, dtype=np.float64)[None, :] + 0.1 * rows, 10)


# Q = K = V = X: token t (0-based) is [t + 1, ..., t + 8].
TUTORIAL_X = np.arange(4, dtype=np.float64)[:, None] + np.arange(1, 9, dtype=np.float64)[None, :]
TUTORIAL_W1_Q = _tutorial_pattern([0.1, 0.2, 0.3, 0.4])
TUTORIAL_W1_K = _tutorial_pattern([0.2, 0.1, 0.4, 0.3])
TUTORIAL_W1_V = _tutorial_pattern([0.3, 0.4, 0.1, 0.2])
TUTORIAL_W2_Q = _tutorial_pattern([0.2, 0.4, 0.1, 0.3])
TUTORIAL_W_O = np.round(np.arange(8, dtype=np.float64)[:, None] * 0.1 + np.arange(1, 9)[None, :] * 0.1, 10)

# Head 1's key/value column permutations of its query matrix, applied to head 2 (see module docstring).
KEY_COLUMNS = (1, 0, 3, 2)
VALUE_COLUMNS = (2, 3, 0, 1)
CHOSEN_W2_K = TUTORIAL_W2_Q[:, KEY_COLUMNS]
CHOSEN_W2_V = TUTORIAL_W2_Q[:, VALUE_COLUMNS]
CHOSEN_MATRICES_REASON = (
    "The tutorial prints W_2^Q but not W_2^K or W_2^V. In head 1, W_1^K and W_1^V are W_1^Q with its columns "
    "permuted as (1, 0, 3, 2) and (2, 3, 0, 1); head 2 gets the same relation: W_2^K = W_2^Q[:, (1, 0, 3, 2)], "
    "W_2^V = W_2^Q[:, (2, 3, 0, 1)]. Both keep the tutorial's pattern (a permutation of [0.1, 0.2, 0.3, 0.4] "
    "plus 0.1 per row), are deterministic, and can be checked by hand."
)

# What the tutorial prints for head 1 (section 3.2) and its multiplication count (section 3.4).
TUTORIAL_PRINTED = {
    "Q1": np.array(
        [[22.0, 25.2, 28.4, 31.6], [26.0, 29.8, 33.6, 37.4], [30.0, 34.4, 38.8, 43.2], [34.0, 39.0, 44.0, 49.0]]
    ),
    "K1": np.array(
        [[22.8, 19.6, 32.0, 28.8], [26.8, 23.0, 37.6, 33.8], [30.8, 26.4, 43.2, 38.8], [34.8, 29.8, 48.8, 43.8]]
    ),
    "V1": np.array(
        [[25.6, 28.8, 19.2, 22.4], [30.4, 34.2, 22.8, 26.6], [35.2, 39.6, 26.4, 30.8], [40.0, 45.0, 30.0, 35.0]]
    ),
}
TUTORIAL_COUNTS = {"projections": 768, "scores": 128, "weighted_values": None, "output_projection": 256, "total": 1152}

ONE_HOT_WEIGHT = 0.99
MAX_SEQ_LEN = 64
MAX_D_MODEL = 512


@dataclass
class WorkedExample:
    """Every intermediate of one multi-head attention pass, float64 numpy, the tutorial's layout (``X @ W``).

    Per-head arrays are stacked on a leading head axis: ``q``, ``k``, ``v``, ``heads`` are
    ``[h, n, d_k]``; ``scores`` (after the score function, before the mask) and ``weights`` are ``[h, n, n]``.
    """

    x: np.ndarray
    w_q: np.ndarray  # [h, d_model, d_k]
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray  # [h * d_k, d_model]
    score: str
    causal: bool
    keep_mask: np.ndarray  # [n, n] bool, True = may attend
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    heads: np.ndarray
    concat: np.ndarray
    output: np.ndarray
    module_output: np.ndarray
    dimension_trace: pd.DataFrame
    operation_counts: pd.DataFrame
    from_tutorial: bool = False
    notes: dict = field(default_factory=dict)
    tokens: list[str] | None = None  # words, where the example has them; else "token 1", "token 2", ...

    @property
    def num_heads(self) -> int:
        return self.w_q.shape[0]

    @property
    def d_k(self) -> int:
        return self.w_q.shape[2]

    @property
    def seq_len(self) -> int:
        return self.x.shape[0]

    @property
    def token_labels(self) -> list[str]:
        return list(self.tokens) if self.tokens else [f"token {i + 1}" for i in range(self.seq_len)]

    @property
    def d_model(self) -> int:
        return self.x.shape[1]

    @property
    def module_max_abs_diff(self) -> float:
        """Largest difference between the step-by-step output and ``MultiHeadAttention.forward``."""
        return float(np.max(np.abs(self.output - self.module_output)))

    @property
    def is_one_hot(self) -> bool:
        """True when softmax has saturated: in every head, every row puts more than 99% on one key."""
        return bool(self.weights.max(axis=-1).min() > ONE_HOT_WEIGHT)

    @property
    def discrepancies(self) -> pd.DataFrame:
        """``printed_discrepancies(self)`` for the tutorial's example; an empty frame of the same columns otherwise."""
        if self.from_tutorial:
            return printed_discrepancies(self)
        return pd.DataFrame(columns=["quantity", "index", "printed_value", "true_value", "difference", "note"])

    @property
    def total_matmul_multiplications(self) -> int:
        counts = self.operation_counts
        return int(counts.loc[counts["kind"] == "matmul", "multiplications"].sum())


def _module(w_q, w_k, w_v, w_o, score: str) -> MultiHeadAttention:
    """A float64 ``MultiHeadAttention`` holding the given per-head matrices (no biases)."""
    h, d_model, d_k = w_q.shape

    def linear_layout(per_head):  # [h, d_model, d_k] -> nn.Linear weight [h * d_k, d_model]
        return torch.from_numpy(np.concatenate(list(per_head), axis=1).T.copy())

    mha = MultiHeadAttention(d_model, h, bias=False, score=score, d_k=d_k).double()
    return mha.set_weights(linear_layout(w_q), linear_layout(w_k), linear_layout(w_v), torch.from_numpy(w_o.T.copy()))


def _operation_counts(
    n: int, d_model: int, h: int, d_k: int, score: str, causal: bool, from_tutorial: bool
) -> pd.DataFrame:
    """Multiplications per step, counted from the shapes (a matmul [a, b] @ [b, c] costs a * b * c)."""
    inner = h * d_k
    printed = TUTORIAL_COUNTS if from_tutorial else {}
    rows = [
        (
            "projections",
            "Q_i, K_i, V_i = X W_i^Q, X W_i^K, X W_i^V",
            "matmul",
            "3 · h · n · d_model · d_k",
            3 * h * n * d_model * d_k,
        ),
        ("scores", "Q_i K_i^T", "matmul", "h · n · n · d_k", h * n * n * d_k),
    ]
    if score == "scaled":
        # mha_core multiplies Q by 1/sqrt(d_k) before the product: n * d_k per head instead of n * n.
        rows.append(("scale", "Q_i / sqrt(d_k) (folded into Q)", "elementwise", "h · n · d_k", h * n * d_k))
    elif score == "cosine":
        # Squares for the two norms, then one division per entry of Q and K.
        rows.append(("normalise", "Q_i / |Q_i|, K_i / |K_i|", "elementwise", "4 · h · n · d_k", 4 * h * n * d_k))
    rows += [
        ("softmax", "divide each exp(score) by its row sum", "elementwise", "h · n · n", h * n * n),
        ("weighted_values", "A_i V_i", "matmul", "h · n · n · d_k", h * n * n * d_k),
        ("output_projection", "Concat(head_1..head_h) W^O", "matmul", "n · (h · d_k) · d_model", n * inner * d_model),
    ]
    frame = pd.DataFrame(rows, columns=["step", "formula", "kind", "count_formula", "multiplications"])
    frame["printed_count"] = pd.array([printed.get(step) for step in frame["step"]], dtype="Int64")
    frame.attrs["causal_note"] = (
        "A causal mask does not change the count: masked scores are still computed, then set to -inf." if causal else ""
    )
    return frame


def _dimension_trace(x, q, k, v, scores, weights, heads, concat, output, q_flat) -> pd.DataFrame:
    """The shape of each tensor as mha_core holds it (batch axis included), read from the tensors."""
    rows = [
        ("input", "X", "[batch, seq, d_model]", x),
        ("project", "X W^Q (all heads at once)", "[batch, seq, h · d_k]", q_flat),
        ("split heads", "Q", "[batch, heads, seq, d_k]", q),
        ("split heads", "K", "[batch, heads, seq, d_k]", k),
        ("split heads", "V", "[batch, heads, seq, d_k]", v),
        ("scores", "score(Q, K)", "[batch, heads, seq, seq]", scores),
        ("softmax", "A = softmax(scores + mask)", "[batch, heads, seq, seq]", weights),
        ("weighted values", "A V", "[batch, heads, seq, d_k]", heads),
        ("merge heads", "Concat(head_1..head_h)", "[batch, seq, h · d_k]", concat),
        ("output", "Concat W^O", "[batch, seq, d_model]", output),
    ]
    return pd.DataFrame(
        [(step, tensor, axes, list(t.shape)) for step, tensor, axes, t in rows],
        columns=["step", "tensor", "axes", "shape"],
    )


def compute_example(
    x, w_q, w_k, w_v, w_o, score: str = "scaled", causal: bool = False, from_tutorial: bool = False
) -> WorkedExample:
    """Run multi-head attention step by step with mha_core on ``x [n, d_model]`` and per-head matrices.

    ``w_q``, ``w_k``, ``w_v``: ``[h, d_model, d_k]``; ``w_o``: ``[h * d_k, d_model]`` (the tutorial's layout).
    """
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"score must be one of {SCORE_FUNCTIONS}, got {score!r}")
    x = np.asarray(x, dtype=np.float64)
    w_q, w_k, w_v, w_o = (np.asarray(w, dtype=np.float64) for w in (w_q, w_k, w_v, w_o))
    h, d_model, d_k = w_q.shape
    if x.ndim != 2 or x.shape[1] != d_model or w_k.shape != w_q.shape or w_v.shape != w_q.shape:
        raise ValueError(f"x must be [n, {d_model}] and W_q, W_k, W_v [h, d_model, d_k]; got {x.shape}, {w_q.shape}")
    if w_o.shape != (h * d_k, d_model):
        raise ValueError(f"W_o must be [{h * d_k}, {d_model}], got {w_o.shape}")
    mha = _module(w_q, w_k, w_v, w_o, score)
    n = x.shape[0]
    keep = causal_keep_mask(n, n) if causal else torch.ones(n, n, dtype=torch.bool)
    with torch.no_grad():
        x_batch = torch.from_numpy(x)[None]  # [1, n, d_model]
        q, k, v = mha.project(x_batch, x_batch, x_batch)  # each [1, h, n, d_k]
        scores = attention_scores(q, k, score)
        weights = masked_softmax(scores, keep)
        heads = torch.matmul(weights, v)
        concat = mha.merge_heads(heads)
        output = mha.out_proj(concat)
        module_output, _ = mha(x_batch, causal=causal)
        q_flat = mha.merge_heads(q)
    return WorkedExample(
        x=x,
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
        w_o=w_o,
        score=score,
        causal=bool(causal),
        keep_mask=keep.numpy(),
        q=q[0].numpy(),
        k=k[0].numpy(),
        v=v[0].numpy(),
        scores=scores[0].numpy(),
        weights=weights[0].numpy(),
        heads=heads[0].numpy(),
        concat=concat[0].numpy(),
        output=output[0].numpy(),
        module_output=module_output[0].numpy(),
        dimension_trace=_dimension_trace(
            x=x_batch,
            q=q,
            k=k,
            v=v,
            scores=scores,
            weights=weights,
            heads=heads,
            concat=concat,
            output=output,
            q_flat=q_flat,
        ),
        operation_counts=_operation_counts(
            n=n, d_model=d_model, h=h, d_k=d_k, score=score, causal=causal, from_tutorial=from_tutorial
        ),
        from_tutorial=from_tutorial,
    )


def worked_example(score: str = "scaled", causal: bool = False) -> WorkedExample:
    """The tutorial's example: X, W_1^Q, W_1^K, W_1^V, W_2^Q and W^O as printed; W_2^K, W_2^V as chosen above."""
    example = compute_example(
        TUTORIAL_X,
        np.stack([TUTORIAL_W1_Q, TUTORIAL_W2_Q]),
        np.stack([TUTORIAL_W1_K, CHOSEN_W2_K]),
        np.stack([TUTORIAL_W1_V, CHOSEN_W2_V]),
        TUTORIAL_W_O,
        score=score,
        causal=causal,
        from_tutorial=True,
    )
    example.notes["chosen_matrices"] = CHOSEN_MATRICES_REASON
    return example


# ---- a readable example: four words, features you can name, softmax far from one-hot ----------------
READABLE_TOKENS = ["The", "cat", "sat", "down"]
READABLE_FEATURES = ["function word", "noun", "verb", "adverb", "position 1", "position 2", "position 3", "position 4"]


def readable_example(score: str = "scaled", causal: bool = False) -> WorkedExample:
    """ "The cat sat down" in 8 named features, with two heads whose question can be read off the weights.

    Each word's vector says what kind of word it is (dimensions 1-4) and where it stands (5-8).
    Head 1 asks "who does it?": a verb's query matches a noun's key, so "sat" looks at "cat".
    Head 2 asks "what came just before?": position p's query matches position p - 1's key.
    Scores of about 1.5 to 2 (not 50) keep softmax readable: the top key gets most, not all, of the weight.
    """
    x = np.zeros((4, 8))
    x[np.arange(4), [0, 1, 2, 3]] = 1.0  # the kind of word
    x[np.arange(4), 4 + np.arange(4)] = 1.0  # its position
    w_q, w_k, w_v = np.zeros((3, 2, 8, 4))
    w_q[0, 2, 0], w_k[0, 1, 0] = 2.0, 1.5  # head 1: a verb's query meets a noun's key
    w_q[0, 0:4, 1] = 0.5  # ... and every word weakly asks for a verb
    w_k[0, 2, 1] = 1.0
    for position in range(1, 4):  # head 2: position p asks for position p - 1
        w_q[1, 4 + position, position] = 2.0
        w_k[1, 4 + position - 1, position] = 2.0
    w_v[:, np.arange(4), np.arange(4)] = 1.0  # values: the kind of word, in both heads
    w_o = np.zeros((8, 8))
    w_o[np.arange(4), np.arange(4)] = 1.0  # head 1's findings go to dimensions 1-4 ...
    w_o[4 + np.arange(4), 4 + np.arange(4)] = 1.0  # ... head 2's to dimensions 5-8
    example = compute_example(x, w_q, w_k, w_v, w_o, score=score, causal=causal)
    example.tokens = list(READABLE_TOKENS)
    example.notes["features"] = list(READABLE_FEATURES)
    return example


def random_example(
    seq_len: int = 4, d_model: int = 8, num_heads: int = 2, seed: int = 0, score: str = "scaled", causal: bool = False
) -> WorkedExample:
    """The same computation on random numbers: X ~ N(0, 1), weights ~ N(0, 1 / d_model).

    That weight scale keeps the entries of Q and K near unit variance, so a dot product of two
    d_k-dimensional rows has variance ~d_k: exactly the growth the 1/sqrt(d_k) scaling undoes.
    """
    for name, value, top in (
        ("seq_len", seq_len, MAX_SEQ_LEN),
        ("d_model", d_model, MAX_D_MODEL),
        ("num_heads", num_heads, MAX_D_MODEL),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= top:
            raise ValueError(f"{name} must be an integer from 1 to {top}, got {value!r}")
    if d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    d_k = d_model // num_heads
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((seq_len, d_model))
    w_q, w_k, w_v = (rng.standard_normal((num_heads, d_model, d_k)) / math.sqrt(d_model) for _ in range(3))
    w_o = rng.standard_normal((d_model, d_model)) / math.sqrt(d_model)
    return compute_example(x, w_q, w_k, w_v, w_o, score=score, causal=causal)


def printed_discrepancies(example: WorkedExample | None = None) -> pd.DataFrame:
    """Where the tutorial's printed numbers disagree with its own inputs, one row per difference.

    Columns: ``quantity, index, printed_value, true_value, difference, note``. ``index`` is ``(row, col)``
    for matrix entries and ``None`` for counts and statements.
    """
    example = worked_example() if example is None else example
    if not example.from_tutorial:
        raise ValueError(
            "printed discrepancies exist only for the tutorial's own example (worked_example()), not for a "
            "random example (random_example(seed=...))"
        )
    rows = []
    for name, printed in TUTORIAL_PRINTED.items():
        true = {"Q1": example.q, "K1": example.k, "V1": example.v}[name][0]
        for row, col in zip(*np.nonzero(~np.isclose(printed, true, rtol=0.0, atol=1e-9))):
            rows.append(
                (
                    name,
                    (int(row), int(col)),
                    float(printed[row, col]),
                    float(true[row, col]),
                    f"{name} = X @ W_1^{name[0]}: row {row + 1} of X times column {col + 1} of W_1^{name[0]}",
                )
            )
    counts = example.operation_counts.set_index("step")["multiplications"]
    rows.append(
        (
            "count: attention",
            None,
            float(TUTORIAL_COUNTS["scores"]),
            float(counts["scores"] + counts["weighted_values"]),
            "Section 3.4 counts h · n · n · d_k for Q K^T only; the weights @ V product costs as much again",
        )
    )
    rows.append(
        (
            "count: total",
            None,
            float(TUTORIAL_COUNTS["total"]),
            float(example.total_matmul_multiplications),
            "768 + 128 + 256 omits the weights @ V step (128): the matrix products need 1280 multiplications",
        )
    )
    rows.append(
        (
            "scaling applied twice",
            None,
            None,
            None,
            "The tutorial's step 2 writes scores1 = Q1 @ K1^T / sqrt(d_k) and then scores1 = scores1 / sqrt(4); "
            "run as written it divides by sqrt(d_k) twice. The scores here are divided once.",
        )
    )
    frame = pd.DataFrame(rows, columns=["quantity", "index", "printed_value", "true_value", "note"])
    frame.insert(4, "difference", frame["true_value"] - frame["printed_value"])
    return frame


def discrepancy_summary(discrepancies: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per printed matrix: how many of its entries are wrong and the largest error."""
    frame = printed_discrepancies() if discrepancies is None else discrepancies
    entries = frame[frame["index"].notna()]
    summary = entries.groupby("quantity", sort=False).agg(
        wrong_entries=("difference", "size"), max_abs_error=("difference", lambda d: float(np.abs(d).max()))
    )
    summary["printed_entries"] = [TUTORIAL_PRINTED[name].size for name in summary.index]
    return summary.reset_index()


def softmax_saturation(
    d_k_values: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    n_keys: int = 16,
    samples: int = 256,
    seed: int = 0,
) -> pd.DataFrame:
    """How peaked softmax gets as d_k grows, for each score function.

    q and k have independent N(0, 1) entries, so q . k has variance d_k: without scaling the scores
    spread out and softmax tends to one-hot (max weight -> 1, entropy -> 0). Columns: ``d_k, score,
    max_weight, entropy, entropy_fraction`` (entropy / log(n_keys): 1 = uniform, 0 = one-hot), means
    over ``samples`` query rows.
    """
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_k_values:
        q = torch.randn(samples, 1, d_k, generator=generator, dtype=torch.float64)
        k = torch.randn(samples, n_keys, d_k, generator=generator, dtype=torch.float64)
        for score in SCORE_FUNCTIONS:
            weights = masked_softmax(attention_scores(q, k, score))[:, 0, :]
            entropy = -(weights * torch.log(weights.clamp_min(1e-300))).sum(-1)
            rows.append(
                (
                    int(d_k),
                    score,
                    float(weights.max(-1).values.mean()),
                    float(entropy.mean()),
                    float(entropy.mean() / math.log(n_keys)),
                )
            )
    return pd.DataFrame(rows, columns=["d_k", "score", "max_weight", "entropy", "entropy_fraction"])


# ---- the decoder lesson: the model's choice of the next word ------------------------------------------------
def temperature_probabilities(logits, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) over the tokens given (float64); temperature 0: all of it on the largest
    logit (greedy). How a temperature spreads the choice: below 1 it sharpens the distribution, above 1 flattens
    it. Raises ``ValueError`` for a negative temperature."""
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not temperature >= 0:
        raise ValueError(f"The temperature must be 0 or more, got {temperature}.")
    if temperature == 0:
        chosen = np.zeros_like(logits)
        chosen[int(np.argmax(logits))] = 1.0
        return chosen
    scaled = logits / float(temperature)
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()


def attended_earlier(attentions, position: int, top: int = 3, skip: Sequence[int] = ()) -> list[tuple[int, float]]:
    """The ``top`` earlier tokens (and the token itself) that the token at ``position`` attends to most, averaged
    over the heads of one layer: ``attentions`` ``[heads, n, n]``; ``[(key, mean weight), ...]``, most first.
    ``skip``: keys left out (the attention sink, where heads park what they do not need)."""
    row = np.asarray(attentions, dtype=np.float64)[:, int(position), : int(position) + 1].mean(axis=0)
    left_out = set(int(key) for key in skip)
    order = [int(key) for key in np.argsort(-row, kind="stable") if int(key) not in left_out][: int(top)]
    return [(key, float(row[key])) for key in order]
