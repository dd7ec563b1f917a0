"""Cost of the head metrics against the model's own forward pass; profiling throughput.

    python -m bench.metrics [--repeats 3] [--sentences 200] [--skip-profile | --profile-only] [--threads T]

Part 1: every metric of a 12 x 12-head run (random BertConfig, bert-base sizes) at n = 128 and 512,
against one transformers forward pass of the same input (eager attention, attentions returned).
Goal: head_metrics costs under 25% of the forward pass.

Part 2: ``mha_core.profile`` on UD EWT dev sentences (embedded MiniLM) in sentences per second,
against bare batched forward passes (same sentences, same batch size, attentions returned).
Goal: ratio >= 0.85. Also against tokenizing + the bare forward (a profile starts from words),
and in CPU time as well as wall time (``--threads 1``: CPU time is this process's own work, the
steadier measure on a shared machine).

Times are the best of ``--repeats`` runs (the machine is shared; the minimum is the least disturbed).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

import mha_core
from bench.timing import machine
from mha_core.run import AttentionRun

BATCH_SIZE = 16
SAMPLED_QUERIES = 32


def best_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def random_bert(max_positions: int):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=12,
        num_attention_heads=12,
        hidden_size=768,
        intermediate_size=3072,
        max_position_embeddings=max_positions,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return BertModel(config).eval()


def run_from_attentions(attentions: torch.Tensor, tokens: list[str]) -> AttentionRun:
    n = len(tokens)
    special = np.zeros(n, dtype=bool)
    special[[0, -1]] = True
    return AttentionRun(
        model_name="random-bert",
        family="bert",
        is_causal=False,
        tokens=tokens,
        attentions=attentions.numpy(),
        special_mask=special,
        word_ids=np.where(special, -1, np.arange(n)),
        words=tokens,
        segment_ids=np.zeros(n),
    )


def metrics_table(repeats: int) -> list[tuple]:
    model = random_bert(512)
    rows = []
    for n in (128, 512):
        input_ids = torch.randint(1000, 20000, (1, n))

        def forward(input_ids=input_ids):
            with torch.inference_mode():
                out = model(input_ids=input_ids, output_attentions=True)
            if not out.attentions:
                raise RuntimeError("empty attentions: the model is not using eager attention")
            return out

        forward_s = best_time(forward, repeats)
        attentions = torch.stack(forward().attentions)[:, 0]  # [L, H, n, n]
        tokens = ["[CLS]"] + [f"t{i}" if i % 7 else "," for i in range(1, n - 1)] + ["[SEP]"]
        run = run_from_attentions(attentions, tokens)
        metrics_s = best_time(lambda run=run: mha_core.head_metrics(run), repeats)
        metrics = mha_core.head_metrics(run)
        roles_s = best_time(lambda run=run, metrics=metrics: mha_core.head_roles(run, metrics=metrics), repeats)
        distances_s = best_time(lambda run=run: mha_core.head_distances(run), 1 if n > 256 else repeats)
        sampled_s = best_time(lambda run=run: mha_core.head_distances(run, max_queries=SAMPLED_QUERIES), repeats)
        rows.append((n, forward_s, metrics_s, roles_s, distances_s, sampled_s))
    return rows


def profile_table(num_sentences: int, repeats: int) -> tuple[int, float, float]:
    from mha_core.analysis.syntax import ud_ewt_dev

    model = mha_core.load_model("minilm")
    sentences = ud_ewt_dev(max_sentences=num_sentences)
    tokenizer, hf_model = model.tokenizer, model.hf_model
    encoded = [tokenizer(s.words, is_split_into_words=True, truncation=True) for s in sentences]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["input_ids"]))

    def bare_forward():
        # The same length-sorted, padded batches a profile would run, with nothing done afterwards.
        for start in range(0, len(order), BATCH_SIZE):
            batch = tokenizer.pad([encoded[i] for i in order[start : start + BATCH_SIZE]], return_tensors="pt")
            with torch.inference_mode():
                out = hf_model(**batch, output_attentions=True)
            if not out.attentions:
                raise RuntimeError("empty attentions")

    def profile():
        return mha_core.profile(model, sentences, batch_size=BATCH_SIZE, cache=False)

    def tokenize_and_forward():
        # The bare forward as a profile must run it: from the sentences' words, tokenizing included.
        for start in range(0, len(order), BATCH_SIZE):
            chunk = [
                tokenizer(sentences[i].words, is_split_into_words=True, truncation=True)
                for i in order[start : start + BATCH_SIZE]
            ]
            with torch.inference_mode():
                hf_model(**tokenizer.pad(chunk, return_tensors="pt"), output_attentions=True)

    # Interleaved, so a change in the machine's load hits both sides alike. Wall and CPU time of each
    # (at one torch thread, CPU time is what the process itself did, whatever else the machine runs).
    best = {name: [float("inf"), float("inf")] for name in ("bare", "tokenized", "profile")}
    for _ in range(repeats):
        for name, function in (("bare", bare_forward), ("tokenized", tokenize_and_forward), ("profile", profile)):
            wall, cpu = time.perf_counter(), time.process_time()
            function()
            best[name][0] = min(best[name][0], time.perf_counter() - wall)
            best[name][1] = min(best[name][1], time.process_time() - cpu)
    return len(sentences), best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--profile-only", action="store_true", help="only part 2 (profiling throughput)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{machine()}; best of {args.repeats}\n")
    if not args.profile_only:
        print_metrics_table(args.repeats)
    if args.skip_profile:
        return
    count, best = profile_table(args.sentences, args.repeats)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nload average {load}")
    print(f"Profiling throughput (MiniLM, {count} UD EWT dev sentences, batch {BATCH_SIZE})")
    print(
        "| time | bare batched forward (sent/s) | tokenizing + bare forward (sent/s) | mha_core.profile (sent/s) "
        "| profile / bare (goal >= 0.85) | profile / (tokenizing + bare) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for index, kind in enumerate(("wall", "CPU")):
        bare, tokenized, profile = (count / best[name][index] for name in ("bare", "tokenized", "profile"))
        print(
            f"| {kind} | {bare:.1f} | {tokenized:.1f} | {profile:.1f} | {profile / bare:.2f} | {profile / tokenized:.2f} |"
        )


def print_metrics_table(repeats: int) -> None:
    """Part 1."""
    print("Head metrics vs one forward pass (random BertConfig, 12 layers x 12 heads, batch 1)")
    print(
        "| n | forward pass (s) | head_metrics (s) | ratio (goal < 0.25) | head_roles (s) | ratio "
        f"| head_distances, all queries (s) | ratio | head_distances, {SAMPLED_QUERIES} queries (s) | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, forward_s, metrics_s, roles_s, distances_s, sampled_s in metrics_table(repeats):
        print(
            f"| {n} | {forward_s:.3f} | {metrics_s:.3f} | {metrics_s / forward_s:.2f} | {roles_s:.4f} | "
            f"{roles_s / forward_s:.3f} | {distances_s:.2f} | {distances_s / forward_s:.1f} | {sampled_s:.2f} | "
            f"{sampled_s / forward_s:.2f} |"
        )


if __name__ == "__main__":
    main()
