"""Benchmark: the lab's induction run against its goals, and its training speed against torch.nn.MultiheadAttention.

1. Goals. The default induction lab trains (scoring every 25 steps) until every goal is met or a
   wall-clock limit passes; printed: the wall time (training + scoring, from the first step) at which
   the repeated-position loss falls below 20% of its start, the best layer-0 previous-token score and the
   best layer-1 induction score pass 0.8, and the phase change step. Goal: all within 30 s.
2. Speed. The same model (same weights, same data stream) with each block's attention replaced by
   ``torch.nn.MultiheadAttention``: with per-head weights (``need_weights=True``, "torch+w", what the
   lab needs to show heads) and without (``need_weights=False``, the fused SDPA path, "torch"). Training
   steps are timed in interleaved rounds; printed: medians and the ratios lab / torch (goal <= 1.10).

Usage: python -m bench.lab [--limit-s 60] [--rounds 15] [--steps-per-round 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from bench.timing import machine
from mha_core.lab import Lab, LabConfig, phase_change_step

GOAL_SCORE, GOAL_LOSS_SHARE, GOAL_S = 0.8, 0.2, 30.0


def goals(limit_s: float) -> None:
    lab = Lab(LabConfig())
    first: dict[str, float | None] = {"repeated loss < 20% of start": None, "previous-token L0 > 0.8": None}
    first["induction L1 > 0.8"] = None
    started = time.perf_counter()
    best = {"previous": 0.0, "induction": 0.0}

    def scored(lab: Lab, record: dict) -> None:
        now = time.perf_counter() - started
        start_loss = lab.records[0]["repeated_loss"]
        previous = float(record["scores"]["previous_token"][0].max())
        induction = float(record["scores"]["induction"][1:].max())
        best["previous"], best["induction"] = max(best["previous"], previous), max(best["induction"], induction)
        checks = {
            "repeated loss < 20% of start": record["repeated_loss"] < GOAL_LOSS_SHARE * start_loss,
            "previous-token L0 > 0.8": previous > GOAL_SCORE,
            "induction L1 > 0.8": induction > GOAL_SCORE,
        }
        for name, passed in checks.items():
            if passed and first[name] is None:
                first[name] = (now, lab.step)

    while time.perf_counter() - started < limit_s and any(v is None for v in first.values()):
        lab.train(25, score_every=25, callback=scored)
    elapsed = time.perf_counter() - started
    history = lab.history()
    print(
        f"Induction lab, default settings ({lab.config.num_layers} layers x {lab.config.num_heads} heads, "
        f"d_model {lab.config.d_model}, batch {lab.config.batch_size} x {lab.config.seq_len} tokens): "
        f"{lab.step} steps in {elapsed:.1f} s wall ({lab.seconds:.1f} s of it training)\n"
    )
    print("| goal | reached at (wall s) | step | within 30 s |")
    print("|---|---:|---:|:---:|")
    for name, value in first.items():
        if value is None:
            print(f"| {name} | not within {limit_s:.0f} s | - | no |")
        else:
            print(f"| {name} | {value[0]:.1f} | {value[1]} | {'yes' if value[0] <= GOAL_S else 'no'} |")
    print(
        f"\nphase change (repeated loss below half its start) at step {phase_change_step(history)}; "
        f"best scores: previous-token L0 {best['previous']:.2f}, induction L1 {best['induction']:.2f}; "
        f"repeated loss {lab.records[0]['repeated_loss']:.2f} -> {lab.records[-1]['repeated_loss']:.2f}\n"
    )


class TorchAttention(nn.Module):
    """``nn.MultiheadAttention`` behind the lab block's attention interface, causal, with the same weights."""

    def __init__(self, ours, need_weights: bool):
        super().__init__()
        self.need_weights = need_weights
        self.inner = nn.MultiheadAttention(ours.d_model, ours.num_heads, batch_first=True)
        with torch.no_grad():
            self.inner.in_proj_weight.copy_(ours.qkv_weight)
            self.inner.in_proj_bias.copy_(ours.qkv_bias)
            self.inner.out_proj.weight.copy_(ours.out_proj.weight)
            self.inner.out_proj.bias.copy_(ours.out_proj.bias)

    def forward(self, x, causal=True, hooks=None):
        n = x.shape[1]
        hidden = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = may not attend
        if self.need_weights:
            return self.inner(x, x, x, attn_mask=hidden, need_weights=True, average_attn_weights=False)
        return self.inner(x, x, x, attn_mask=hidden, need_weights=False, is_causal=True)


def contestant(kind: str) -> Lab:
    lab = Lab(LabConfig())
    lab.train(0)  # the step-0 scoring (it needs the weights torch does not return), outside the timing
    if kind != "lab":
        for block in lab.model.blocks:
            block.attention = TorchAttention(block.attention, need_weights=kind == "torch+w")
        lab.optimizer = torch.optim.AdamW(
            lab.model.parameters(), lr=lab.config.learning_rate, weight_decay=lab.config.weight_decay
        )
    return lab


def speed(rounds: int, steps_per_round: int) -> None:
    labs = {kind: contestant(kind) for kind in ("lab", "torch+w", "torch")}
    # A benchmark of different models is worthless: the three start from the same function.
    ids = torch.from_numpy(labs["lab"].eval_batch.inputs)
    with torch.no_grad():
        reference = labs["lab"].model(ids)[0]
        for kind in ("torch+w", "torch"):
            labs[kind].model.eval()
            assert torch.allclose(labs[kind].model(ids)[0], reference, atol=1e-4), kind
    times = {kind: [] for kind in labs}
    for lab in labs.values():  # warm-up
        lab.train(3, score_every=10**9, score_last=False)
    for _ in range(rounds):
        for kind, lab in labs.items():
            start = time.perf_counter()
            lab.train(steps_per_round, score_every=10**9, score_last=False)
            times[kind].append((time.perf_counter() - start) / steps_per_round)
    median = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"Training steps, medians of {rounds} interleaved rounds of {steps_per_round} steps\n")
    print("| lab (ms/step) | torch+w (ms/step) | torch (ms/step) | lab / torch+w | lab / torch | lab steps/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {median['lab'] * 1e3:.2f} | {median['torch+w'] * 1e3:.2f} | {median['torch'] * 1e3:.2f} | "
        f"{median['lab'] / median['torch+w']:.2f} | {median['lab'] / median['torch']:.2f} | {1 / median['lab']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-s", type=float, default=60.0, help="wall-clock limit of the goals run")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps-per-round", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the app)")
    parser.add_argument("--skip-goals", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine()}\n")
    if not args.skip_goals:
        goals(args.limit_s)
    speed(args.rounds, args.steps_per_round)


if __name__ == "__main__":
    main()
