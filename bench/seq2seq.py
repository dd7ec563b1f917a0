"""Encoder-decoder timings: a cross-attention run against the bare transformers forward, and the cross view painted.

    python -m bench.seq2seq [--rounds 20] [--repeats 5] [--threads 1] [--skip-browser]

1. ``Seq2SeqModel.run_ids`` of a 64-token source and a 64-token target (all three attentions as
   ``AttentionRun``s, tokens and words included) against the bare transformers forward pass with
   ``output_attentions=True`` on the same ids, interleaved round by round, medians. Randomly initialised
   models of the real checkpoints' shapes (t5-small, facebook/bart-base, Helsinki-NLP/opus-mt-en-de), with the
   installed MiniLM's tokenizer (30,522 pieces), saved to a temporary folder: nothing comes from the hub.
   Goal: <= 1.10 x.
2. Explore's cross view at 128 target x 128 source tokens in Debian Chromium (a small random BART whose
   positions stop at 128, so both texts are cut to exactly 128 tokens): measured in the browser, from a click on a
   head's tile (or on "Model view") until every canvas of the view is painted again (``data-drawn``) and the
   frame holding them is on the screen (the next animation frame). Goal:
   <= 0.3 s for the head view.

Prints the load average and Markdown tables. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import torch

import mha_core as mc

# The real checkpoints' shapes (from their config.json); their weights are drawn at random here.
SIZES = {
    "t5-small": (
        "T5",
        dict(
            d_model=512,
            d_kv=64,
            d_ff=2048,
            num_layers=6,
            num_decoder_layers=6,
            num_heads=8,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
        ),
    ),
    "bart-base": (
        "Bart",
        dict(
            d_model=768,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=12,
            decoder_attention_heads=12,
            encoder_ffn_dim=3072,
            decoder_ffn_dim=3072,
        ),
    ),
    "opus-mt-en-de": (
        "Marian",
        dict(
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
        ),
    ),
}
SMALL = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4}
SMALL.update(decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)


def random_checkpoint(folder: Path, kind: str, max_positions: int, **sizes) -> Path:
    """A randomly initialised T5 / Bart / Marian checkpoint with MiniLM's tokenizer (installed, 30,522 pieces,
    about the real vocabularies' size), saved to ``folder``: nothing comes from the hub."""
    import transformers

    tokenizer = mc.load_model("minilm").tokenizer
    tokenizer.model_max_length = max_positions
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id)
    if kind == "T5":
        ids["decoder_start_token_id"] = tokenizer.pad_token_id
    else:
        ids.update(max_position_embeddings=max_positions, decoder_start_token_id=tokenizer.sep_token_id)
    config = getattr(transformers, f"{kind}Config")(vocab_size=len(tokenizer), **ids, **sizes)
    model_class = {"T5": "T5ForConditionalGeneration", "Bart": "BartForConditionalGeneration"}.get(
        kind, "MarianMTModel"
    )
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


GOAL_RATIO = 1.10
GOAL_PAINT_S = 0.3


def load_average() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def timed_pair(model, source: list[int], target: list[int], rounds: int) -> tuple[float, float]:
    """Medians (ms) of the bare transformers forward with attentions and of ``run_ids``, interleaved."""
    ids, decoder_ids = torch.tensor([source]), torch.tensor([target])

    def bare():
        with torch.inference_mode():
            return model.hf_model(
                input_ids=ids, decoder_input_ids=decoder_ids, output_attentions=True, use_cache=False
            ).cross_attentions

    def ours():
        return model.run_ids(source, target)

    for _ in range(3):
        bare(), ours()
    times: dict[str, list[float]] = {"bare": [], "ours": []}
    for _ in range(rounds):
        for label, call in (("bare", bare), ("ours", ours)):
            start = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - start)
    return tuple(1000 * statistics.median(times[k]) for k in ("bare", "ours"))


def forward_rows(rounds: int, n: int = 64) -> list[tuple]:
    rows = []
    for name, (kind, sizes) in SIZES.items():
        folder = random_checkpoint(Path(tempfile.mkdtemp()) / name, kind, 512, **sizes)
        model = mc.load_model(str(folder))
        generator = torch.Generator().manual_seed(0)
        ordinary = [i for i in range(len(model.tokenizer)) if i not in model.tokenizer.all_special_ids]
        drawn = [ordinary[int(i)] for i in torch.randint(len(ordinary), (2 * n,), generator=generator)]
        source, target = drawn[:n], [model.decoder_start_id, *drawn[n : 2 * n - 1]]
        bare_ms, ours_ms = timed_pair(model, source, target, rounds)
        rows.append((name, model.encoder_layers, model.num_heads, bare_ms, ours_ms, ours_ms / bare_ms))
    return rows


PAINT_JS = """
async ([selector, done]) => {
  const root = document.querySelector('.hs-headview');
  const before = root.dataset.drawn;
  const start = performance.now();
  document.querySelector(selector).click();
  while (root.dataset.drawn === before || root.dataset.drawn === '' || !root.dataset.drawn.endsWith(done)) {
    await new Promise((resolve) => requestAnimationFrame(resolve));
    if (performance.now() - start > 30000) return null;
  }
  // Until the frame holding the new canvases is on the screen: the next animation frame, then a task after it.
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  return (performance.now() - start) / 1000;
}
"""


def paint_rows(repeats: int) -> list[tuple]:
    from tools.browser import chromium_page, head_view_js, streamlit_server, wait_for_app

    folder = random_checkpoint(Path(tempfile.mkdtemp()) / "bart", "Bart", 128, **SMALL)
    text = " ".join(["the cat sat on the mat and the dog ran to the old house by the river"] * 20)
    run = mc.load_model(str(folder)).run(text, text)
    n_tgt, n_src = run.cross.num_tokens, run.cross.num_keys
    query = {"model": str(folder), "source": text, "target": text, "write": "0"}
    head_times, model_times = [], []
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/explore?{urlencode(query)}")
        wait_for_app(page)
        page.wait_for_function(head_view_js(4, "cat"), timeout=180_000)
        for repeat in range(repeats):
            head = (repeat + 1) % 4
            head_times.append(page.evaluate(PAINT_JS, [f'.hs-tile[data-head="{head}"]', f":{head}"]))
            wait_for_app(page)  # the switch reaches the server (and the link) on a rerun: let it finish
            page.wait_for_timeout(300)
        for _ in range(repeats):
            model_times.append(page.evaluate(PAINT_JS, ['.hs-tab[data-view="model"]', ":model"]))
            wait_for_app(page)
            page.wait_for_timeout(300)
            page.evaluate(PAINT_JS, ['.hs-tab[data-view="head"]', ""])
            wait_for_app(page)
            page.wait_for_timeout(300)
    head_times = [t for t in head_times if t is not None]  # None: not painted within 30 s (reported as missing)
    model_times = [t for t in model_times if t is not None]
    return [
        ("head view (4 heads + the enlarged one)", n_tgt, n_src, statistics.median(head_times or [float("nan")])),
        ("model view (2 layers x 4 heads)", n_tgt, n_src, statistics.median(model_times or [float("nan")])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (the app's default is 1 a pass; on a loaded machine "
        "2 threads spend most of their time waiting for each other)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load_average()}")
    print(f"\n64-token source + 64-token target, medians of {args.rounds} interleaved rounds\n")
    print("| model size | encoder layers x heads | bare forward (ms) | Headscope run (ms) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, layers, heads, bare_ms, ours_ms, ratio in forward_rows(args.rounds):
        mark = "met" if ratio <= GOAL_RATIO else "missed"
        print(f"| {name} | {layers} x {heads} | {bare_ms:.1f} | {ours_ms:.1f} | {ratio:.2f} ({mark}) |")
    if args.skip_browser:
        return
    print(f"\nCross view painted in Chromium, medians of {args.repeats}, load average {load_average()}\n")
    print("| view | target x source tokens | painted (s) |")
    print("|---|---:|---:|")
    for view, n_tgt, n_src, seconds in paint_rows(args.repeats):
        print(f"| {view} | {n_tgt} x {n_src} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
