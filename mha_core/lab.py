"""The lab: train a tiny transformer built from ``MultiHeadAttention`` and watch its heads specialise.

A ``Lab`` holds a small causal model (token embedding, positions, blocks of the from-scratch attention,
optional MLPs), an AdamW optimiser, a seeded data stream for one task, and the history of every scored
step. Each task says which head it should grow and scores it with the scorers of ``mha_core.roles``:

    induction   random tokens in which a segment repeats at a random offset: a previous-token head in
                layer 0, then an induction head in layer 1 that reads the token after the earlier copy
    positional  output the token ``k`` steps back: one head at offset -k
    largest     output the largest token so far: a content head that finds the largest key

Two training choices serve the induction circuit (``LabConfig``; measured in docs/benchmarks.md): each
training sequence reads the learned positions from a random start row (``position_offsets``), because a
copy comes after its source and with fixed positions the last positions never teach the previous-token
head; and the loss weighs the positions no circuit can predict less (``other_weight``). Evaluation, scores
and ablations use every position and rows from 0.

Training is reproducible for a seed and a torch thread count. ``Lab.train`` takes the library's
``progress(done, total, message)``, which may raise to stop (the page's Pause does that).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .errors import HeadscopeError
from .positional import sinusoidal_encoding
from .progress import Progress, report
from .roles import (
    DECODER_MIN_SCORE,
    copy_target_pattern,
    detection_score,
    offset_pattern,
    prefix_matching_score,
    previous_token_pattern,
    query_mass_score,
)
from .run import AttentionRun

POSITIONS = ("learned", "sinusoidal", "none")
TASKS = ("induction", "positional", "largest")
HISTORY_COLUMNS = ["step", "seconds", "loss", "repeated_loss", "layer", "head", "role", "score"]
ROLE_THRESHOLD = DECODER_MIN_SCORE  # a head "has" its role from the first scored step at or above this
IGNORE = -100  # target of a position that is not trained on
CHECKPOINT_VERSION = 1
# The lab trains tiny models: a config is refused before anything is allocated when a training step would
# hold more than this (``LabConfig.training_bytes``; the largest size the Lab page offers needs about 15 MB).
MAX_TRAINING_BYTES = 2 << 30
MAX_SEED = 2**63 - 1  # torch.manual_seed takes up to 2**64 - 1; numpy's generators need a seed >= 0


@dataclass(frozen=True)
class LabConfig:
    """Everything that decides a training run: the same config, seed and thread count give the same run."""

    task: str = "induction"
    num_layers: int = 2
    num_heads: int = 4
    d_model: int = 64
    mlp: bool = False  # attention-only by default: the circuits are then in the heads alone
    positions: str = "learned"
    # Small enough for the circuit to form in a few hundred steps on a laptop CPU: short sequences make
    # the first, nearly uniform attention put more weight on the right key, and a batch of 96 gives a
    # gradient clean enough to leave the loss plateau early. A large vocabulary: in a sequence of
    # distinct tokens, "any token not seen yet" is worth ln(V) - ln(V - i) nats at position i (1 nat
    # at i = 20 of V = 32, 0.17 of V = 128), and broad layer-0 heads that earn it compete with the
    # previous-token head (see docs/benchmarks.md, bench/lab.py).
    vocab_size: int = 128
    seq_len: int = 20
    batch_size: int = 96
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    # Training reads each sequence from a random row 0..position_offsets of a position table that many
    # rows longer than seq_len (evaluation from row 0). A copy comes after its source, so with fixed
    # positions the last positions are never the source of a copy: nothing teaches the previous-token
    # head there, and its score stayed at 0.55-0.67. 0 = fixed positions.
    position_offsets: int = 8
    # The training loss weighs the positions outside ``focus`` (for induction, the random tokens no
    # circuit can predict) by this much against 1 for the focus positions; the other tasks' positions
    # are all focus. At 1 those positions, two thirds of the sequence, mostly reward broad heads that
    # compete with the previous-token head, and the phase change came late; near 0 every head has the
    # one job, so the induction head is duplicated and ablating one of them changes little.
    other_weight: float = 0.3
    seed: int = 0
    offset: int = 3  # the positional task: output the token this many steps back
    eval_sequences: int = 16  # the fixed batch every scored step measures loss and head scores on

    def __post_init__(self):
        if self.task not in TASKS:
            raise HeadscopeError(f"unknown lab task {self.task!r}; choose one of {', '.join(TASKS)}")
        if self.positions not in POSITIONS:
            raise HeadscopeError(f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        for name in ("num_layers", "num_heads", "d_model", "vocab_size", "batch_size", "eval_sequences"):
            if int(getattr(self, name)) < 1:
                raise HeadscopeError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise HeadscopeError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.seq_len < 8:
            raise HeadscopeError(f"seq_len must be at least 8, got {self.seq_len}")
        if self.task == "induction" and self.vocab_size < self.seq_len:
            raise HeadscopeError(
                f"the induction task draws distinct tokens: vocab_size ({self.vocab_size}) must be at least "
                f"seq_len ({self.seq_len})"
            )
        if self.task == "positional" and not 1 <= self.offset < self.seq_len:
            raise HeadscopeError(f"offset must be between 1 and seq_len - 1, got {self.offset}")
        if self.learning_rate <= 0:
            raise HeadscopeError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.position_offsets < 0:
            raise HeadscopeError(f"position_offsets must be at least 0, got {self.position_offsets}")
        if not 0 <= self.other_weight <= 1:
            raise HeadscopeError(f"other_weight must be between 0 and 1, got {self.other_weight}")
        if not 0 <= self.seed <= MAX_SEED:
            raise HeadscopeError(f"seed must be between 0 and {MAX_SEED}, got {self.seed}")
        if self.training_bytes() > MAX_TRAINING_BYTES:
            raise HeadscopeError(
                f"this lab model is too large: a training step would hold about {self.training_bytes() / 2**30:,.1f} "
                f"GB (at most {MAX_TRAINING_BYTES / 2**30:.0f} GB). The lab trains tiny models: fewer layers or "
                "heads, a smaller d_model, vocabulary, batch or sequence."
            )

    def parameter_count(self) -> int:
        """Trained weights of ``LabModel``: embedding, learned positions, blocks, final norm, unembedding."""
        d = self.d_model
        block = 4 * d * d + 4 * d + 2 * d + ((8 * d * d + 5 * d + 2 * d) if self.mlp else 0)
        positions = self.position_rows() * d if self.positions == "learned" else 0
        return 2 * self.vocab_size * d + positions + self.num_layers * block + 2 * d

    def position_rows(self) -> int:
        """Rows of the position table: training starts each sequence at a random row (``position_offsets``)."""
        return self.seq_len + self.position_offsets

    def training_bytes(self) -> int:
        """About what a training step holds at its peak, in bytes: float32 weights, their gradients and
        AdamW's two moments, and the activations kept for the backward pass (every layer's attention
        weights and hidden states, the logits)."""
        hidden = self.batch_size * self.seq_len * self.d_model
        attention = self.batch_size * self.num_heads * self.seq_len**2
        per_layer = 2 * attention + (8 if self.mlp else 4) * hidden
        logits = 2 * self.batch_size * self.seq_len * self.vocab_size
        table = self.position_rows() * self.d_model if self.positions == "sinusoidal" else 0
        return 4 * (4 * self.parameter_count() + table + self.num_layers * per_layer + logits)

    @classmethod
    def from_dict(cls, values: dict) -> LabConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


# ---- tasks ------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """``inputs [B, n]``, ``targets [B, n]`` (IGNORE where not trained), ``focus [B, n]`` bool: the
    positions only the task's circuit can predict (the repeated part, for induction)."""

    inputs: np.ndarray
    targets: np.ndarray
    focus: np.ndarray


def induction_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int) -> Batch:
    """Distinct random tokens; a segment of random length is copied to a random later place.

    Segment length, source and destination are drawn per sequence, so neither the period nor the
    position of the copy is fixed: only "find the earlier copy of this token and read what followed"
    (an induction circuit) predicts it. Tokens are distinct apart from the copy, so each token of the
    copy has exactly one earlier occurrence. ``focus`` marks the queries inside the copy whose next
    token is also in the copy.
    """
    inputs = np.stack([rng.permutation(vocab_size)[:seq_len] for _ in range(batch)])
    focus = np.zeros((batch, seq_len), dtype=bool)
    low, high = max(2, seq_len // 4), seq_len // 2
    for row in range(batch):
        length = int(rng.integers(low, high + 1))
        source = int(rng.integers(0, seq_len - 2 * length + 1))
        destination = int(rng.integers(source + length, seq_len - length + 1))
        inputs[row, destination : destination + length] = inputs[row, source : source + length]
        focus[row, destination : destination + length - 1] = True
    targets = np.full_like(inputs, IGNORE)
    targets[:, :-1] = inputs[:, 1:]
    return Batch(inputs, targets, focus)


def positional_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int, offset: int) -> Batch:
    """Random tokens; query i must output the token ``offset`` places back (none for i < offset)."""
    inputs = rng.integers(0, vocab_size, size=(batch, seq_len))
    targets = np.full_like(inputs, IGNORE)
    targets[:, offset:] = inputs[:, :-offset]
    return Batch(inputs, targets, targets != IGNORE)


def largest_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int) -> Batch:
    """Random tokens; query i must output the largest token among 0..i (a comparison of contents)."""
    inputs = rng.integers(0, vocab_size, size=(batch, seq_len))
    targets = np.maximum.accumulate(inputs, axis=1)
    return Batch(inputs, targets, np.ones_like(inputs, dtype=bool))


def task_batch(config: LabConfig, rng: np.random.Generator, batch: int) -> Batch:
    if config.task == "induction":
        return induction_batch(rng, batch, config.seq_len, config.vocab_size)
    if config.task == "positional":
        return positional_batch(rng, batch, config.seq_len, config.vocab_size, config.offset)
    return largest_batch(rng, batch, config.seq_len, config.vocab_size)


def task_roles(config: LabConfig) -> tuple[str, ...]:
    """The roles a task's heads are scored on, in the order they should appear."""
    if config.task == "induction":
        return ("previous_token", "induction")
    if config.task == "positional":
        return (f"offset_{-config.offset}",)
    return ("copy_largest",)


def role_scores(config: LabConfig, attentions: np.ndarray, batch: Batch) -> dict[str, np.ndarray]:
    """Every role of the task for every head, ``{role: [L, H]}``, averaged over the batch's sequences.

    previous_token  TransformerLens's detection score with the previous-token pattern (``roles``)
    induction       the prefix-matching score: mass on the tokens right after earlier copies of the query
    offset_-k       the detection score with the pattern at offset -k
    copy_largest    per query, the mass on the keys holding the token it must output
    """
    n = attentions.shape[-1]
    out: dict[str, list[np.ndarray]] = {role: [] for role in task_roles(config)}
    for index, ids in enumerate(batch.inputs):
        heads = attentions[index]  # [L, H, n, n]
        for role in out:
            if role == "previous_token":
                value = detection_score(heads, previous_token_pattern(n))
            elif role == "induction":
                value = prefix_matching_score(heads, ids)
            elif role.startswith("offset_"):
                value = detection_score(heads, offset_pattern(n, -config.offset))
            else:
                value = query_mass_score(heads, copy_target_pattern(ids, batch.targets[index]))
            out[role].append(value)
    return {role: np.nanmean(np.stack(values), axis=0) for role, values in out.items()}


# ---- the model --------------------------------------------------------------------------------------
class LabBlock(nn.Module):
    def __init__(self, config: LabConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = MultiHeadAttention(config.d_model, config.num_heads)
        self.mlp = None
        if config.mlp:
            self.mlp_norm = nn.LayerNorm(config.d_model)
            self.mlp = nn.Sequential(
                nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(), nn.Linear(4 * config.d_model, config.d_model)
            )

    def forward(self, x: torch.Tensor, head_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        attended, weights = self.attention(self.attention_norm(x), causal=True, head_mask=head_mask)
        x = x + attended
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x, weights


class LabModel(nn.Module):
    """A causal transformer: embedding (+ positions) -> blocks of MultiHeadAttention -> LayerNorm -> unembedding."""

    def __init__(self, config: LabConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        rows = config.position_rows()
        if config.positions == "learned":
            self.position = nn.Parameter(torch.randn(rows, config.d_model))
        elif config.positions == "sinusoidal":
            self.register_buffer(
                "position", torch.as_tensor(sinusoidal_encoding(rows, config.d_model), dtype=torch.float32)
            )
        else:
            self.position = None
        self.blocks = nn.ModuleList(LabBlock(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(
        self, ids: torch.Tensor, head_mask: torch.Tensor | None = None, offsets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``ids [B, n]`` -> ``(logits [B, n, vocab], [weights [B, H, n, n] per layer])``.

        ``head_mask [L, H]``: 0 zero-ablates a head's output (its slice of the Concat), 1 keeps it.
        ``offsets [B]`` (training): sequence b reads the position rows ``offsets[b] ... offsets[b] + n - 1``
        (at most ``position_offsets``); none = rows ``0 ... n - 1``.
        """
        n = ids.shape[-1]
        if n > self.config.seq_len:
            raise HeadscopeError(f"the lab model reads at most {self.config.seq_len} tokens, got {n}")
        x = self.embed(ids)
        if self.position is not None:
            if offsets is None:
                x = x + self.position[:n]
            else:
                x = x + self.position[offsets[:, None] + torch.arange(n)]
        weights = []
        for layer, block in enumerate(self.blocks):
            x, layer_weights = block(x, None if head_mask is None else head_mask[layer])
            weights.append(layer_weights)
        return self.unembed(self.final_norm(x)), weights


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over the trained positions (and only those in ``where``, when given)."""
    if where is not None:
        targets = targets.masked_fill(~where, IGNORE)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def training_loss(
    logits: torch.Tensor, targets: torch.Tensor, focus: torch.Tensor, other_weight: float
) -> torch.Tensor:
    """The weighted mean cross-entropy training minimises: weight 1 on the ``focus`` positions and
    ``other_weight`` on the other trained ones (``masked_loss`` when that is 1)."""
    if other_weight == 1.0:
        return masked_loss(logits, targets)
    targets = targets.reshape(-1)
    per_position = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, ignore_index=IGNORE, reduction="none")
    weights = torch.where(focus.reshape(-1), 1.0, other_weight) * (targets != IGNORE)
    return (per_position * weights).sum() / weights.sum()


# ---- the lab ----------------------------------------------------------------------------------------
class Lab:
    """A model, its optimiser, its data stream and its history. ``train`` continues where it stopped."""

    def __init__(self, config: LabConfig | None = None, **overrides):
        config = replace(config or LabConfig(), **overrides) if overrides else (config or LabConfig())
        self.config = config
        torch.manual_seed(config.seed)
        self.model = LabModel(config)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.data_rng = np.random.default_rng([config.seed, 1])
        # A fixed evaluation batch (another stream): loss and scores are measured on the same sequences.
        self.eval_batch = task_batch(config, np.random.default_rng([config.seed, 2]), config.eval_sequences)
        self.step = 0
        self.seconds = 0.0  # training time so far (scoring not included)
        self.records: list[dict] = []  # one per scored step: step, seconds, loss, repeated_loss, scores
        self.example_attention: np.ndarray | None = None  # [L, H, n, n] on evaluation sequence 0, last scored step

    # ---- training ---------------------------------------------------------------------------
    def train(
        self,
        steps: int,
        score_every: int = 25,
        progress: Progress | None = None,
        callback=None,
        score_last: bool = True,
    ) -> pd.DataFrame:
        """Train ``steps`` more steps, scoring at step 0, every ``score_every`` steps and (``score_last``)
        after the last one.

        ``callback(lab, record)`` runs after each scored step; ``progress`` after every step (either may
        raise to stop: the steps done so far are kept, and ``train`` continues from them). Returns the history.
        """
        if steps < 0 or score_every < 1:
            raise HeadscopeError(f"steps must be >= 0 and score_every >= 1, got {steps} and {score_every}")
        if not self.records:
            self._score(callback)
        end = self.step + steps
        while self.step < end:
            started = time.perf_counter()
            config = self.config
            batch = task_batch(config, self.data_rng, config.batch_size)
            offsets = None
            if config.position_offsets and self.model.position is not None:
                offsets = torch.from_numpy(self.data_rng.integers(0, config.position_offsets + 1, config.batch_size))
            self.model.train()
            logits, _ = self.model(torch.from_numpy(batch.inputs), offsets=offsets)
            loss = training_loss(
                logits, torch.from_numpy(batch.targets), torch.from_numpy(batch.focus), config.other_weight
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.step += 1
            self.seconds += time.perf_counter() - started
            if self.step % score_every == 0 or (score_last and self.step == end):
                self._score(callback)
            report(progress, steps - (end - self.step), steps, f"step {self.step}, training loss {loss.item():.3f}")
        return self.history()

    @torch.no_grad()
    def evaluate(self, head_mask=None, batch: Batch | None = None) -> dict:
        """Loss, repeated-position loss and attention on a batch (the fixed evaluation batch by default)."""
        batch = batch or self.eval_batch
        self.model.eval()
        mask = None if head_mask is None else torch.as_tensor(np.asarray(head_mask, dtype=np.float32))
        logits, weights = self.model(torch.from_numpy(batch.inputs), head_mask=mask)
        targets = torch.from_numpy(batch.targets)
        return {
            "loss": float(masked_loss(logits, targets)),
            "repeated_loss": float(masked_loss(logits, targets, torch.from_numpy(batch.focus))),
            "attentions": torch.stack(weights, dim=1).numpy(),  # [B, L, H, n, n]
        }

    def _score(self, callback) -> None:
        result = self.evaluate()
        record = {
            "step": self.step,
            "seconds": self.seconds,
            "loss": result["loss"],
            "repeated_loss": result["repeated_loss"],
            "scores": role_scores(self.config, result["attentions"], self.eval_batch),
        }
        self.example_attention = result["attentions"][0]
        self.records.append(record)
        if callback is not None:
            callback(self, record)

    # ---- results ----------------------------------------------------------------------------
    def scores(self) -> pd.DataFrame:
        """The latest scores, one row per head: ``layer, head`` and one column per role."""
        if not self.records:
            self._score(None)
        return scores_frame(self.records[-1]["scores"])

    def history(self) -> pd.DataFrame:
        """Every scored step in long form: one row per (step, head, role); ``HISTORY_COLUMNS``."""
        return history_frame(self.records)

    def attention(self, index: int = 0) -> np.ndarray:
        """Every head's attention on one sequence of the evaluation batch, ``[L, H, n, n]``."""
        return self.evaluate()["attentions"][index]

    def example_tokens(self, index: int = 0) -> list[str]:
        return [str(int(t)) for t in self.eval_batch.inputs[index]]

    def run(self, index: int = 0) -> AttentionRun:
        """The evaluation sequence ``index`` as an ``AttentionRun``: the views and metrics of pretrained models apply."""
        tokens = self.example_tokens(index)
        n = len(tokens)
        return AttentionRun(
            model_name=f"lab:{self.config.task}",
            family="lab",
            is_causal=True,
            tokens=tokens,
            attentions=self.attention(index),
            special_mask=np.zeros(n, dtype=bool),
            word_ids=np.arange(n),
            words=tokens,
            segment_ids=np.zeros(n, dtype=np.int64),
            engine="lab",
            metadata={"lab_step": self.step, "lab_config": asdict(self.config)},
        )

    def ablation(self, layer: int, head: int) -> dict:
        """Loss and repeated-position loss with one head zero-ablated, next to the intact model's."""
        cfg = self.config
        if not (0 <= layer < cfg.num_layers and 0 <= head < cfg.num_heads):
            raise HeadscopeError(f"no head L{layer}H{head} in a {cfg.num_layers} x {cfg.num_heads} model")
        mask = np.ones((cfg.num_layers, cfg.num_heads), dtype=np.float32)
        mask[layer, head] = 0.0
        intact, ablated = self.evaluate(), self.evaluate(head_mask=mask)
        return {
            "loss": intact["loss"],
            "repeated_loss": intact["repeated_loss"],
            "ablated_loss": ablated["loss"],
            "ablated_repeated_loss": ablated["repeated_loss"],
        }

    # ---- checkpoints ------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Config, weights, optimiser state, data position and history, loadable with ``weights_only=True``."""
        path = Path(path)
        torch.save(
            {
                "version": CHECKPOINT_VERSION,
                "config": asdict(self.config),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "seconds": self.seconds,
                "data_rng": _rng_state(self.data_rng),
                "records": [_plain_record(r) for r in self.records],
            },
            path,
        )
        return path

    @classmethod
    def load(cls, path: str | Path) -> Lab:
        try:
            saved = torch.load(Path(path), weights_only=True)
        except Exception as exc:  # a truncated file, a pickle of something else
            raise HeadscopeError(f"not a lab checkpoint: {exc}") from exc
        if not isinstance(saved, dict) or saved.get("version") != CHECKPOINT_VERSION:
            raise HeadscopeError("not a lab checkpoint (no version 1 header)")
        # Checkpoints from before position_offsets / other_weight trained with fixed positions and equal weights.
        lab = cls(LabConfig.from_dict({"position_offsets": 0, "other_weight": 1.0, **saved["config"]}))
        lab.model.load_state_dict(saved["model"])
        lab.optimizer.load_state_dict(saved["optimizer"])
        lab.step, lab.seconds = int(saved["step"]), float(saved["seconds"])
        lab.data_rng.bit_generator.state = _rng_from_plain(saved["data_rng"])
        lab.records = [
            {**r, "scores": {role: np.asarray(v, dtype=np.float64) for role, v in r["scores"].items()}}
            for r in saved["records"]
        ]
        return lab


def _plain_record(record: dict) -> dict:
    return {**record, "scores": {role: value.tolist() for role, value in record["scores"].items()}}


def _rng_state(rng: np.random.Generator) -> dict:
    """numpy's PCG64 state with its 128-bit integers as strings (``weights_only`` loads no big ints)."""
    state = rng.bit_generator.state
    return {
        "bit_generator": state["bit_generator"],
        "state": str(state["state"]["state"]),
        "inc": str(state["state"]["inc"]),
        "has_uint32": int(state["has_uint32"]),
        "uinteger": int(state["uinteger"]),
    }


def _rng_from_plain(plain: dict) -> dict:
    return {
        "bit_generator": plain["bit_generator"],
        "state": {"state": int(plain["state"]), "inc": int(plain["inc"])},
        "has_uint32": plain["has_uint32"],
        "uinteger": plain["uinteger"],
    }


# ---- tables of the history --------------------------------------------------------------------------
def scores_frame(scores: dict[str, np.ndarray]) -> pd.DataFrame:
    from .run import per_head_frame

    first = next(iter(scores.values()))
    return per_head_frame(*first.shape, **scores)


def history_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (scored step, head, role): ``step, seconds, loss, repeated_loss, layer, head, role, score``."""
    rows = []
    for record in records:
        for role, values in record["scores"].items():
            values = np.asarray(values)
            for layer in range(values.shape[0]):
                for head in range(values.shape[1]):
                    rows.append(
                        (
                            record["step"],
                            record["seconds"],
                            record["loss"],
                            record["repeated_loss"],
                            layer,
                            head,
                            role,
                            float(values[layer, head]),
                        )
                    )
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def phase_change_step(history: pd.DataFrame) -> int | None:
    """The first scored step whose repeated-position loss is below half of its start (None before that):
    where the circuit's loss falls off the plateau."""
    losses = history.drop_duplicates("step")[["step", "repeated_loss"]]
    if len(losses) < 2:
        return None
    start = float(losses["repeated_loss"].iloc[0])
    below = losses[losses["repeated_loss"] < 0.5 * start]
    return int(below["step"].iloc[0]) if len(below) else None


def role_appearance(history: pd.DataFrame, threshold: float = ROLE_THRESHOLD) -> pd.DataFrame:
    """For each role, the head with the highest final score, its score, and the first step it reached
    ``threshold`` (NaN if not yet): ``role, layer, head, score, appears_at``."""
    if history.empty:
        return pd.DataFrame(columns=["role", "layer", "head", "score", "appears_at"])
    last = history[history["step"] == history["step"].max()]
    rows = []
    for role in dict.fromkeys(history["role"]):
        best = last[last["role"] == role].sort_values("score", ascending=False, kind="stable").iloc[0]
        curve = history[
            (history["role"] == role) & (history["layer"] == best["layer"]) & (history["head"] == best["head"])
        ]
        reached = curve[curve["score"] >= threshold]
        rows.append(
            {
                "role": role,
                "layer": int(best["layer"]),
                "head": int(best["head"]),
                "score": float(best["score"]),
                "appears_at": float(reached["step"].iloc[0]) if len(reached) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def train_lab(
    steps: int = 1500,
    config: LabConfig | None = None,
    score_every: int = 25,
    progress: Progress | None = None,
    **overrides,
) -> Lab:
    """A new lab trained ``steps`` steps (the one-call form of ``Lab(config).train(steps)``)."""
    lab = Lab(config, **overrides)
    lab.train(steps, score_every=score_every, progress=progress)
    return lab


def lab_summary(lab: Lab) -> str:
    """A few lines for a terminal: the run, its losses, the phase change and every head's scores."""
    history = lab.history()
    first, last = lab.records[0], lab.records[-1]
    phase = phase_change_step(history)
    lines = [
        f"lab {lab.config.task}: {lab.config.num_layers} layers x {lab.config.num_heads} heads, "
        f"d_model {lab.config.d_model}, {lab.step} steps in {lab.seconds:.1f} s (seed {lab.config.seed})",
        f"loss {first['loss']:.3f} -> {last['loss']:.3f}; repeated-position loss "
        f"{first['repeated_loss']:.3f} -> {last['repeated_loss']:.3f}; phase change: "
        + (f"step {phase}" if phase is not None else "not yet"),
    ]
    scores = lab.scores()
    roles = [c for c in scores.columns if c not in ("layer", "head")]
    lines.append("layer head " + " ".join(f"{role:>15}" for role in roles))
    for row in scores.to_dict("records"):
        lines.append(f"{row['layer']:5d} {row['head']:4d} " + " ".join(f"{row[role]:15.3f}" for role in roles))
    for row in role_appearance(history).itertuples(index=False):
        when = f"from step {int(row.appears_at)}" if np.isfinite(row.appears_at) else "not yet"
        lines.append(f"{row.role}: L{row.layer}H{row.head} score {row.score:.2f} (>= {ROLE_THRESHOLD} {when})")
    return "\n".join(lines)
