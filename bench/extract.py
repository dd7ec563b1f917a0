"""Benchmark: extraction overhead, the from-scratch engine, load times and peak memory.

One run prints four markdown tables (medians of interleaved rounds, all under torch.inference_mode):

  1. MiniLM at n = 16, 128, 512 tokens: ``model.run(text)`` (tokenizing, display tokens, words, one
     stacking of the attentions, the AttentionRun) against a bare transformers forward with
     ``output_attentions=True`` on the same ids (goal: ratio <= 1.10); and ``model.run(text, out=buffer)``,
     the same run into an ``AttentionBuffer`` reused from run to run (a caller done with each run first);
  2. the core engine (``core_attentions`` on the same ids) against that bare forward (goal: <= 1.5),
     and ``model.run(text, engine="core")``, which runs both engines and compares them;
  3. cold and warm load times of both embedded models, each in a fresh process: cold is the first
     ``load_model`` in the process (SmolLM2: with an empty cache, so it includes the GGUF conversion),
     warm is a second load in the same process, and "new process, cache present" is SmolLM2's
     first load once the cache exists (what the app pays on every start);
  4. peak resident memory at n = 512, each contestant in a fresh process: the peak, and its increase
     over the loaded model after a short warm-up.

Table 1 also counts minor page faults per call (medians): with glibc's default malloc, whether a
contestant's large temporaries come from memory already touched depends on what the contestants
before it allocated and freed (the heap is trimmed, blocks above the dynamic mmap threshold are
returned), so run the table a second time with the heap fixed to see the compute alone:
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 python -m bench.extract --speed-only``.

Usage: python -m bench.extract [--rounds N] [--threads T] [--speed-only] [--lengths N ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
import mha_core as mc  # noqa: E402
from bench.timing import machine  # noqa: E402
from mha_core.engine.core import core_attentions  # noqa: E402
from mha_core.models.capture import AttentionBuffer  # noqa: E402

LENGTHS = (16, 128, 512)
PASSAGE = (
    "The keys to the old cabinet were found under the table by the children, who said that the dog "
    "had carried them there while everyone was asleep. "
)


def text_of_length(model: mc.LoadedModel, n: int) -> str:
    """A natural text that the model's tokenizer turns into exactly ``n`` tokens, specials included."""
    pieces = model.tokenizer(PASSAGE * (n // 10 + 2), add_special_tokens=False, verbose=False)["input_ids"]
    specials = len(model.tokenizer("a")["input_ids"]) - len(model.tokenizer("a", add_special_tokens=False)["input_ids"])
    text = model.tokenizer.decode(pieces[: n - specials])
    assert len(model.tokenizer(text)["input_ids"]) == n, f"could not build a {n}-token text"
    return text


def contestants(model: mc.LoadedModel, text: str) -> dict:
    ids = torch.tensor([model.tokenizer(text)["input_ids"]])
    buffer = AttentionBuffer()  # a caller done with each run before the next: the same memory every time

    def bare():
        with torch.inference_mode():
            return model.hf_model(input_ids=ids, output_attentions=True).attentions

    def core():
        with torch.inference_mode():
            return core_attentions(model.hf_model, ids)

    return {
        "bare": bare,
        "run": lambda: model.run(text),
        "run buffer": lambda: model.run(text, out=buffer),
        "core": core,
        "run core": lambda: model.run(text, engine="core"),
    }


def measure(model: mc.LoadedModel, n: int, rounds: int) -> dict[str, float]:
    runners = contestants(model, text_of_length(model, n))
    times = {name: [] for name in runners}
    reference = torch.stack(runners["bare"](), dim=1)[0]
    # A benchmark of wrong answers is worthless: check agreement first.
    assert torch.equal(torch.from_numpy(runners["run"]().attentions), reference)
    assert torch.equal(torch.from_numpy(runners["run buffer"]().attentions), reference)
    assert float((runners["core"]()[0] - reference).abs().max()) < 1e-4
    for _ in range(2):
        for run in runners.values():
            run()
    faults = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    medians = {name: statistics.median(values) for name, values in times.items()}
    medians.update({f"faults {name}": statistics.median(values) for name, values in faults.items()})
    medians.update({f"cpu {name}": statistics.median(values) for name, values in cpu.items()})
    return medians


# ---- fresh-process measurements ----------------------------------------------------------------
def memory_mb() -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident memory of this process, in MB."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "VmHWM")))
    return {name: int(value.split()[0]) / 1024 for name, value in fields.items()}


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident memory to the current one."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def child_load(name: str) -> dict:
    start = time.perf_counter()
    mc.load_model(name)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    mc.load_model(name)
    return {"cold": cold, "warm": time.perf_counter() - start}


def child_memory(name: str, contestant: str, n: int) -> dict:
    model = mc.load_model(name)
    runners = contestants(model, text_of_length(model, 16))
    runners[contestant]()
    long_run = contestants(model, text_of_length(model, n))[contestant]
    reset_peak()
    loaded = memory_mb()["VmRSS"]
    result = long_run()
    peak = memory_mb()["VmHWM"]
    del result
    return {"loaded": loaded, "peak": peak, "attention_mb": model.num_layers * model.num_heads * n * n * 4 / 2**20}


def in_child(*args: str, cache_dir: str | None = None) -> dict:
    env = dict(os.environ)
    if cache_dir:
        env["HEADSCOPE_CACHE_DIR"] = cache_dir
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--speed-only", action="store_true", help="only the first table (MiniLM speed)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="token counts of table 1")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        kind, *rest = args.child
        result = child_load(*rest) if kind == "load" else child_memory(rest[0], rest[1], int(rest[2]))
        print(json.dumps(result))
        return

    # The load average says how much else the machine was doing: the ratios are only as good as that.
    malloc = " ".join(f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("MALLOC_"))
    print(f"{machine()}; batch 1, medians of {args.rounds} interleaved rounds; malloc: {malloc or 'glibc defaults'}\n")
    model = mc.load_model("minilm")
    print("MiniLM (6 layers x 12 heads):\n")
    print(
        "| n | bare forward (ms) | model.run (ms) | run / bare | run(out=buffer) / bare | core engine (ms) "
        "| core / bare | run(engine=core) (ms) | page faults per call: bare / run / run(out=buffer) "
        "| CPU time: run / bare | run(out=buffer) / bare |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.lengths:
        med = measure(model, n, args.rounds)
        print(
            f"| {n} | {med['bare'] * 1e3:.2f} | {med['run'] * 1e3:.2f} | {med['run'] / med['bare']:.3f} | "
            f"{med['run buffer'] / med['bare']:.3f} | {med['core'] * 1e3:.2f} | {med['core'] / med['bare']:.2f} | "
            f"{med['run core'] * 1e3:.2f} | {med['faults bare']:.0f} / {med['faults run']:.0f} / "
            f"{med['faults run buffer']:.0f} | {med['cpu run'] / med['cpu bare']:.3f} | "
            f"{med['cpu run buffer'] / med['cpu bare']:.3f} |",
            flush=True,
        )
    del model
    if args.speed_only:
        return

    print("\nLoad times, each model in a fresh process:\n")
    print("| model | cold load (s) | warm load (s) | new process, cache present (s) |")
    print("|---|---:|---:|---:|")
    minilm = in_child("load", "minilm")
    print(f"| minilm | {minilm['cold']:.2f} | {minilm['warm']:.2f} | n/a (no cache) |", flush=True)
    with tempfile.TemporaryDirectory(prefix="headscope-bench-cache-") as cache:
        converted = in_child("load", "smollm2", cache_dir=cache)
        cached = in_child("load", "smollm2", cache_dir=cache)
        print(
            f"| smollm2 | {converted['cold']:.2f} (GGUF conversion) | {converted['warm']:.2f} | {cached['cold']:.2f} |",
            flush=True,
        )

        print(f"\nPeak resident memory at n = {LENGTHS[-1]}, each in a fresh process:\n")
        print(
            "| model | contestant | attentions (MB) | RSS before the run (MB) | peak RSS during it (MB) | increase (MB) |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for name, names in (("minilm", ("bare", "run", "core", "run core")), ("smollm2", ("bare", "run"))):
            for contestant in names:
                mem = in_child("memory", name, contestant, str(LENGTHS[-1]), cache_dir=cache)
                print(
                    f"| {name} | {contestant} | {mem['attention_mb']:.0f} | {mem['loaded']:.0f} | {mem['peak']:.0f} | "
                    f"{mem['peak'] - mem['loaded']:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
