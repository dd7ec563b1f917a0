"""Benchmark: causal evidence on SmolLM2 (mha_core.interventions).

Two measurements, each timed against a bare forward pass of the same inputs in the same run (the
machine is shared: ratios travel, absolute seconds do not):

  induction   the induction experiment, 8 sequences x 101 tokens, 6 conditions (no ablation, top-5
              induction heads, 4 draws of 5 random heads), warm (decoder scores computed before);
              budget 5 s. Reference: 6 bare LM forward passes of the same 8 x 101 tokens.
  importance  Michel et al. gradient importance over N UD EWT dev sentences (default 500); budget
              60 s for 500. Reference: one bare LM forward pass per sentence.

Prints a markdown table: seconds, the reference's seconds, the ratio to the reference, the time
against its budget (scaled to 500 sentences), and the process CPU seconds (all threads), which a
crowded machine inflates less than wall-clock time. Usage:
python -m bench.ablate [--sentences N] [--threads T] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import mha_core as mc
from mha_core.analysis.roles import repeated_random_tokens
from mha_core.corpus import reading
from mha_core.interventions import experiments
from mha_core.interventions.experiments import decoder_head_scores

INDUCTION_BUDGET_S = 5.0
IMPORTANCE_BUDGET_S = 60.0  # for 500 sentences


CPU_SECONDS: dict[str, float] = {}


def timed(function, rounds: int = 1, name: str | None = None) -> float:
    """Median wall-clock seconds of ``rounds`` calls; the median CPU seconds go to ``CPU_SECONDS[name]``."""
    times, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        function()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    if name:
        CPU_SECONDS[name] = statistics.median(cpu)
    return statistics.median(times)


def bare_forwards(model, ids: torch.Tensor, count: int) -> None:
    with torch.inference_mode():
        for _ in range(count):
            model.lm_model(input_ids=ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = mc.load_model("smollm2")
    scores = decoder_head_scores(model)
    tokenizer = model.tokenizer
    ids = torch.as_tensor(
        repeated_random_tokens(len(tokenizer), 50, 2, 8, 0, tokenizer.all_special_ids, model.encoder.bos_token_id)
    )
    assert ids.shape == (8, 101), ids.shape

    def experiment():
        return experiments.induction_experiment(model, top_k=5, random_draws=4, scores=scores)

    frame = experiment()  # warm-up, and the result printed below
    rows = []
    induction_s = timed(experiment, args.rounds, "induction")
    reference_s = timed(lambda: bare_forwards(model, ids, len(frame)), args.rounds)
    rows.append(
        ("induction (8 x 101, 6 conditions)", induction_s, reference_s, induction_s / INDUCTION_BUDGET_S, "induction")
    )

    texts = reading.corpus_texts(mc.ud_ewt_dev(args.sentences))
    importance_s = timed(lambda: mc.head_importance(model, texts), args.rounds, "importance")

    def forward_each():
        with torch.inference_mode():
            for text in texts:
                model.lm_model(input_ids=torch.tensor([model.encode(text).input_ids]))

    forward_s = timed(forward_each, args.rounds)
    scaled = importance_s * 500 / len(texts)
    rows.append(
        (f"importance ({len(texts)} UD sentences)", importance_s, forward_s, scaled / IMPORTANCE_BUDGET_S, "importance")
    )

    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| measurement | seconds | bare forward s | ratio to forward | time / budget | CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, seconds, reference, budget, key in rows:
        print(
            f"| {name} | {seconds:.2f} | {reference:.2f} | {seconds / reference:.2f} | {budget:.2f} "
            f"| {CPU_SECONDS[key]:.1f} |"
        )
    print()
    print(experiments.summarize_experiment(frame).to_string(index=False))


if __name__ == "__main__":
    main()
