"""``LabConfig``: everything that decides a training run of the lab."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import HeadscopeError
from ..operations.lab import training_step_bytes

POSITIONS = ("learned", "sinusoidal", "none")


TASKS = ("induction", "positional", "largest")


# The lab trains tiny models: a config is refused before anything is allocated when a training step would
# hold more than this (``mha_core.operations.lab.training_step_bytes``, which its training also reserves on a
# server; the largest size the Lab page offers needs about 15 MB).
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
        step_bytes = training_step_bytes(self)
        if step_bytes > MAX_TRAINING_BYTES:
            raise HeadscopeError(
                f"this lab model is too large: a training step would hold about {step_bytes / 2**30:,.1f} "
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

    @classmethod
    def from_dict(cls, values: dict) -> LabConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
