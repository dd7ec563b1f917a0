"""Long runs on SmolLM2: time and memory against the bare transformers forward, exactness, zoom latency, roles.

    python -m bench.long [--lengths 4096 8192] [--json bench/out/long.json]

For each length, one needle-in-a-haystack prompt (the long examples of assets/long/documents.json, longest first,
``haystack``; the default ``NEEDLE`` at half depth, its question and the needle again as the answer;
``mha_core.models.long.needle_prompt``):

- time: ``run_long`` (the pass with every head's overviews pooled and the metrics streamed, then the metrics table
  finished) against the bare transformers forward of the same tokens with its default attention (sdpa), in one
  sitting, ``--repeats`` interleaved pairs (sdpa first), the ratio of the medians and each pair's ratio; the goal is
  <= 1.5 x at 4,096 tokens;
- memory: peak resident memory above the loaded model (VmHWM after resetting it through /proc/self/clear_refs),
  for both; goals <= 1.5 GB at 4,096 and <= 3 GB at 8,192;
- zoom latency (library side): an overview of a zoomed region (a quarter of the head, 128 cells) and a
  token-level block of 64 x 64, medians of 5;
- roles: sink-at-length, local and retrieval heads (``LongRun.roles`` with the prompt's copies), and each layer's
  median 90%-mass window.

Exactness (once): at 1,024 tokens, every block against transformers' eager attentions (max |difference|);
the first 1,024 x 1,024 of the 4,096-token run against the 1,024-token run.
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
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION, haystack, needle_prompt, run_long
from mha_core.operations.long import long_run_bytes

GB = 2**30


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-exactness", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved sdpa / long pairs per length (medians)")
    args = parser.parse_args()
    model = mc.load_model("smollm2")
    warm = run_long(model, token_ids=list(range(100, 228)))  # first-call costs out of the way
    warm.head_metrics()
    del warm
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average "
        + ", ".join(f"{v:.1f}" for v in os.getloadavg())
    )
    results, kept = {"lengths": {}}, {}
    for n in args.lengths:
        ids, copies = needle_prompt(model, haystack(), NEEDLE, NEEDLE_QUESTION, depth=0.5, num_tokens=n)
        load = os.getloadavg()[0]
        sdpa_times, long_times, sdpa_peaks, long_peaks = [], [], [], []
        for _ in range(args.repeats):  # interleaved pairs: a noisy neighbour slows both sides alike
            sdpa_s, sdpa_peak, _ = bare_forward(model, ids)
            run = None  # the previous pair's run goes before this one is measured
            long_s, long_peak, run = peak_above(lambda ids=ids: _finished(model, ids))
            sdpa_times.append(sdpa_s), long_times.append(long_s)
            sdpa_peaks.append(sdpa_peak), long_peaks.append(long_peak)
        result = measure(run, copies, n)
        result.update(
            tokens=n,
            load_average_start=load,
            sdpa_forward_s=statistics.median(sdpa_times),
            long_run_s=statistics.median(long_times),
            ratio=statistics.median(long_times) / statistics.median(sdpa_times),
            pair_ratios=[round(b / a, 3) for a, b in zip(sdpa_times, long_times)],
            sdpa_peak_gb=max(sdpa_peaks) / GB,
            long_peak_gb=max(long_peaks) / GB,
            reserved_gb=long_run_bytes(model, n) / GB,
        )
        results["lengths"][n] = result
        print(json.dumps(result, default=str))
        if n == 4096:
            kept[4096] = run
        del run
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
