"""Long runs on SmolLM2: time and memory against the bare transformers forward on several inputs, exactness, zoom
latency, roles.

    python -m bench.long [--lengths 4096 8192] [--repeats 3] [--inputs needle ud document random] [--json out.json]

For each length, four inputs of exactly that many tokens (``inputs``): the needle-in-a-haystack prompt (the long
examples of assets/long/documents.json, longest first, ``haystack``; the default ``NEEDLE`` at half depth, its question
and the needle again as the answer; ``mha_core.models.long.needle_prompt``), running text of the UD English EWT dev
split (its sentences in file order), the longest document of assets/long/ (cut), and random token ids (seeded).

- time: ``run_long`` (the pass with every head's overviews pooled and the metrics streamed, then the metrics table
  finished) against the bare transformers forward of the same tokens with its default attention (sdpa), in one
  sitting: ``--repeats`` rounds, each a pair (sdpa, then the long run; the other way round every other round) for
  every input in turn, so that a noisy neighbour slows every input and both sides alike; per input the ratio of the
  medians and each pair's ratio, of wall-clock time and of this process's CPU time; the goal is <= 1.5 x at 4,096
  tokens on every input;
- memory: peak resident memory above the loaded model (VmHWM after resetting it through /proc/self/clear_refs),
  for both; goals <= 1.5 GB at 4,096 and <= 3 GB at 8,192;
- on the needle prompt's last run: zoom latency (library side: an overview of a zoomed region, a quarter of the
  head at 128 cells, and a token-level block of 64 x 64, medians of 5), and the roles (sink-at-length, local and
  retrieval heads: ``LongRun.roles`` with the prompt's copies; each layer's median 90%-mass window).

Exactness (once): at 1,024 tokens, every block against transformers' eager attentions (max |difference|);
the first 1,024 x 1,024 of the 4,096-token needle run against the 1,024-token run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import mha_core as mc
from bench.timing import machine
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION, haystack, long_documents, needle_prompt, run_long
from mha_core.operations.long import long_run_bytes

GB = 2**30
# The inputs each length is measured on, and their names in the table.
INPUTS = {
    "needle": "needle prompt",
    "ud": "running UD text",
    "document": "a long document of assets/long/",
    "random": "random tokens",
}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_above(function):
    """(seconds, peak resident bytes above the resident size before, value) of ``function()``."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    before = _status("VmRSS")
    start = time.perf_counter()
    value = function()
    seconds = time.perf_counter() - start
    return seconds, _status("VmHWM") - before, value


def bare_forward(model, ids: list[int]):
    hf = model.hf_model
    hf.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            return peak_above(lambda: hf(torch.tensor([ids])).last_hidden_state.shape)
    finally:
        hf.set_attn_implementation("eager")


def inputs(model, n: int, names) -> dict[str, tuple[list[int], list | None]]:
    """``{name: (token ids, needle copies or None)}``: ``n`` tokens of each input named in ``names``."""
    tokenizer = model.tokenizer
    bos = [tokenizer.bos_token_id] if model.default_bos else []

    def cut(text: str) -> list[int]:
        ids = bos + tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < n:
            raise ValueError(f"the text has {len(ids)} tokens, fewer than {n}")
        return ids[:n]

    made = {}
    for name in names:
        if name == "needle":
            made[name] = needle_prompt(model, haystack(), NEEDLE, NEEDLE_QUESTION, depth=0.5, num_tokens=n)
        elif name == "ud":
            made[name] = cut(" ".join(sentence.text for sentence in ud_ewt_dev())), None
        elif name == "document":
            made[name] = cut(long_documents()[-1]["text"] * (1 + n // 7000)), None  # 7,596 tokens, cut (repeated past)
        elif name == "random":
            special = set(tokenizer.all_special_ids)
            vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special])
            made[name] = bos + np.random.default_rng(n).choice(vocabulary, n - len(bos)).tolist(), None
        else:
            raise ValueError(f"no input {name!r}: {INPUTS}")
    return made


def median_time(function, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def exactness(model, ids: list[int], long4096) -> dict:
    short_ids = ids[:1024]
    short = run_long(model, token_ids=short_ids)
    with torch.inference_mode():  # the dense runs stop at 512 tokens: transformers' eager weights directly
        eager = model.hf_model(torch.tensor([short_ids]), output_attentions=True).attentions
    diff = max(
        float(np.abs(short.attention_block(layer, head, (0, 1024), (0, 1024)) - eager[layer][0, head].numpy()).max())
        for layer in range(model.num_layers)
        for head in range(model.num_heads)
    )
    del eager
    prefix = None
    if long4096 is not None:
        prefix = max(
            float(
                np.abs(
                    long4096.attention_block(layer, head, (0, 1024), (0, 1024))
                    - short.attention_block(layer, head, (0, 1024), (0, 1024))
                ).max()
            )
            for layer in range(model.num_layers)
            for head in range(model.num_heads)
        )
    return {"eager_max_abs_diff_1024": diff, "prefix_max_abs_diff_1024_of_4096": prefix}


def timed_pair(model, ids: list[int], long_first: bool) -> dict:
    """One sdpa forward and one long run (and its metrics table) of ``ids``, in the order given: wall-clock and CPU
    seconds and peak memory of each, and the run."""
    pair = {}
    for side in ("long", "sdpa") if long_first else ("sdpa", "long"):
        cpu = time.process_time()
        if side == "sdpa":
            seconds, peak, run = *bare_forward(model, ids)[:2], None
        else:
            seconds, peak, run = peak_above(lambda: _finished(model, ids))
        pair[side] = {"s": seconds, "cpu_s": time.process_time() - cpu, "peak": peak}
        pair["run"] = run if run is not None else pair.get("run")
    return pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--inputs", nargs="+", default=list(INPUTS), choices=INPUTS)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-exactness", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of interleaved sdpa / long pairs (medians)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = mc.load_model("smollm2")
    warm = run_long(model, token_ids=list(range(100, 228)))  # first-call costs out of the way
    warm.head_metrics()
    del warm
    print(machine())
    results, kept = {"lengths": {}}, {}
    for n in args.lengths:
        made = inputs(model, n, args.inputs)
        load = os.getloadavg()
        pairs = {name: [] for name in made}
        last_needle = None
        for round_ in range(args.repeats):  # every input in turn, each round: a neighbour slows all of them alike
            for name, (ids, _) in made.items():
                pair = timed_pair(model, ids, long_first=round_ % 2 == 1)
                run = pair.pop("run")
                if name == "needle":
                    last_needle = run
                del run
                pairs[name].append(pair)
                print(json.dumps({"tokens": n, "input": name, "round": round_, **pair}, default=float), flush=True)
        by_input = {name: summary(done) for name, done in pairs.items()}
        result = {
            "tokens": n,
            "load_average_start": load,
            "load_average_end": os.getloadavg(),
            "reserved_gb": long_run_bytes(model, n) / GB,
            "inputs": by_input,
        }
        if last_needle is not None:
            result["needle_run"] = measure(last_needle, made["needle"][1], n)
            if n == 4096:
                kept[4096] = last_needle
        results["lengths"][n] = result
        del last_needle
        print(json.dumps(result, default=str))
        print(table(n, by_input))
    if not args.no_exactness:
        ids, _ = needle_prompt(model, haystack(), NEEDLE, NEEDLE_QUESTION, depth=0.5, num_tokens=4096)
        long4096 = kept.get(4096)
        if long4096 is not None and long4096.token_ids[:1024] != ids[:1024]:
            long4096 = None
        results["exactness"] = exactness(model, ids, long4096)
        print(json.dumps(results["exactness"]))
    results["load_average_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))


def summary(pairs: list[dict]) -> dict:
    """Medians, the ratio of the medians and each pair's ratio (wall-clock and CPU), peaks, of one input's pairs."""
    out = {}
    for clock in ("s", "cpu_s"):
        sdpa, long = ([pair[side][clock] for pair in pairs] for side in ("sdpa", "long"))
        out[f"sdpa_{clock}"], out[f"long_{clock}"] = statistics.median(sdpa), statistics.median(long)
        out[f"ratio_{clock}"] = statistics.median(long) / statistics.median(sdpa)
        out[f"pair_ratios_{clock}"] = [round(b / a, 3) for a, b in zip(sdpa, long)]
    out["sdpa_peak_gb"] = max(pair["sdpa"]["peak"] for pair in pairs) / GB
    out["long_peak_gb"] = max(pair["long"]["peak"] for pair in pairs) / GB
    return out


def table(n: int, by_input: dict) -> str:
    """The sitting's markdown table for docs/benchmarks.md."""
    lines = [
        "| input | tokens | sdpa forward (s) | long run + metrics (s) | ratio of medians | pairs | ratio of CPU time "
        "| peak above the model: sdpa / long (GB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in by_input.items():
        pairs = ", ".join(f"{r:.2f}" for r in row["pair_ratios_s"])
        lines.append(
            f"| {INPUTS[name]} | {n:,} | {row['sdpa_s']:.2f} | {row['long_s']:.2f} | {row['ratio_s']:.2f} | {pairs} "
            f"| {row['ratio_cpu_s']:.2f} | {row['sdpa_peak_gb']:.2f} / {row['long_peak_gb']:.2f} |"
        )
    return "\n".join(lines)


def measure(run, copies, n: int) -> dict:
    """Zoom latency, stored bytes and the long-context roles of one run."""
    zoom_s = median_time(lambda: run.attention_overview(20, 3, 128, "mean", rows=(n // 4, n // 2), cols=(0, n // 2)))
    token_s = median_time(lambda: run.attention_block(20, 3, (n - 64, n), (n - 64, n)))
    roles = run.roles(copies)
    by_layer = run.local_windows().groupby("layer")["median_window"].median()
    sink_bands = run.sink_by_distance(band=max(512, n // 8))
    retrieval = roles[roles["role"] == "retrieval"].sort_values("score", ascending=False)
    return {
        "stored_gb": run.stored_bytes / GB,
        "zoom_overview_s": zoom_s,
        "token_block_s": token_s,
        "roles": roles.groupby("role").size().to_dict(),
        "sink_heads": int((roles["role"] == "sink at length").sum()),
        "local_heads": int(roles["role"].str.startswith("local").sum()),
        "retrieval_heads": [
            [int(r.layer), int(r.head), round(float(r.score), 3)] for r in retrieval.head(12).itertuples()
        ],
        "copies": len(copies),
        "median_window_by_layer": [float(v) for v in by_layer.to_numpy()],
        "sink_mass_by_band": sink_bands.groupby("distance_from")["mass"].mean().round(4).to_dict(),
    }


def _finished(model, ids):
    run = run_long(model, token_ids=ids)
    run.head_metrics()
    return run


if __name__ == "__main__":
    main()
