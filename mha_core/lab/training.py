"""``Lab``: a model, its optimiser, its data stream and the history of every scored step; what the history shows
(the phase change, when each role appears)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analysis.roles import DECODER_MIN_SCORE
from ..errors import HeadscopeError
from ..progress import Progress, report
from ..run import AttentionRun, per_head_frame
from .config import LabConfig
from .model import LabModel, masked_loss, training_loss
from .tasks import Batch, role_scores, task_batch

HISTORY_COLUMNS = ["step", "seconds", "loss", "repeated_loss", "layer", "head", "role", "score"]


ROLE_THRESHOLD = DECODER_MIN_SCORE  # a head "has" its role from the first scored step at or above this


CHECKPOINT_VERSION = 1


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
