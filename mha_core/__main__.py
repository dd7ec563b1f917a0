"""Command line: ``python -m mha_core <command> ...``.

Each command is one ``add_<command>(subparsers)`` function that registers its arguments and a
handler; ``COMMANDS`` lists them. Adding a command is adding one such function to the list.
"""

from __future__ import annotations

import argparse
import sys

from .errors import HeadscopeError


def print_progress(done: float, total: float, message: str = "") -> None:
    """Progress on stderr, so stdout stays the one-line result."""
    from .progress import fraction

    print(f"[{fraction(done, total):4.0%}] {message}", file=sys.stderr, flush=True)


# ---- extract ------------------------------------------------------------------------------------
def add_extract(subparsers) -> None:
    from .models import DEFAULT_MODEL, ENGINES

    parser = subparsers.add_parser(
        "extract",
        help="attention of every layer and head for one text, saved as .npz",
        description="Run one text (or a sentence pair, for encoders) through a model and save the AttentionRun.",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="minilm, smollm2, a Hugging Face model id, or a checkpoint directory (default: %(default)s)",
    )
    parser.add_argument("--text", required=True, help="the text to run")
    parser.add_argument("--pair", default=None, help="a second text, [SEP]-separated (encoders only)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="transformers",
        help="transformers, or core: the from-scratch engine, checked against transformers",
    )
    parser.add_argument("--out", default=None, help="where to save the run (.npz); omit to only print the summary")
    parser.set_defaults(handler=run_extract)


def run_extract(args) -> int:
    from .models import load_model

    model = load_model(args.model, progress=print_progress)
    run = model.run(args.text, text_pair=args.pair, engine=args.engine)
    if args.out:
        run.save(args.out)
    print(run.summary() + (f" -> {args.out}" if args.out else ""))
    return 0


# ---- profile ------------------------------------------------------------------------------------
def add_profile(subparsers) -> None:
    from .corpus import DEFAULT_SHARD_SIZE
    from .models import DEFAULT_MODEL

    parser = subparsers.add_parser(
        "profile",
        help="measure every head over a corpus (metrics, roles, dependency accuracy), saved as a table",
        description="Run a corpus through a model in batches and write one row per head. With trees "
        "(ud-ewt-dev or a .conllu file) the Clark et al. dependency accuracy goes to "
        "<out>.dependency.<ext> as well. The corpus is profiled in shards, each cached as soon as "
        "it is done: a second run is instant, and an interrupted run (Ctrl-C) resumes when the same "
        "command is run again.",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="minilm, smollm2, a Hugging Face model id, or a checkpoint directory (default: %(default)s)",
    )
    parser.add_argument(
        "--corpus",
        default="ud-ewt-dev",
        help="ud-ewt-dev (shipped UD English EWT dev split), a .conllu file, or a text file "
        "with one sentence per line (default: %(default)s)",
    )
    parser.add_argument("--max-sentences", type=int, default=None, help="profile only the first N sentences")
    parser.add_argument("--batch-size", type=int, default=16, help="sentences per forward pass (default: %(default)s)")
    parser.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_SIZE,
        help="sentences per shard, the unit that is cached and resumed (default: %(default)s)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute even when a cached profile exists, and cache nothing (no resume)",
    )
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_profile)


def run_profile(args) -> int:
    from tqdm import tqdm

    from .corpus import (
        check_profile_settings,
        head_table,
        profile,
        profile_summary,
        read_corpus,
        shards_in_cache,
        table_format,
        write_table,
    )
    from .models import load_model

    table_format(args.out)  # fail before the slow part
    check_profile_settings(args.batch_size, args.shard_size)
    sentences = read_corpus(args.corpus, args.max_sentences)
    model = load_model(args.model, progress=print_progress)
    settings = dict(batch_size=args.batch_size, shard_size=args.shard_size)
    try:
        with tqdm(total=len(sentences), unit="sentence", file=sys.stderr) as bar:

            def advance(done: float, total: float, message: str = "") -> None:
                bar.set_postfix_str(message, refresh=False)
                bar.update(done - bar.n)

            result = profile(model, sentences, progress=advance, cache=not args.no_cache, **settings)
    except KeyboardInterrupt:
        if args.no_cache:
            print("interrupted: nothing was kept (--no-cache)", file=sys.stderr)
        else:
            kept, total = shards_in_cache(model, sentences, **settings)
            print(
                f"interrupted: {kept} of {total} shards are done and kept in the cache; run the same command "
                "again to resume from them",
                file=sys.stderr,
            )
        return 130  # the shell's code for a run stopped by Ctrl-C
    out = write_table(head_table(result), args.out)
    written = [str(out)]
    if result.dependency is not None:
        written.append(str(write_table(result.dependency, out.with_name(f"{out.stem}.dependency{out.suffix}"))))
    print(profile_summary(result))
    print("wrote " + ", ".join(written))
    return 0


# ---- ablate -------------------------------------------------------------------------------------
def add_ablate(subparsers) -> None:
    from .causal import ABLATIONS
    from .models import DEFAULT_MODEL, ENGINES

    parser = subparsers.add_parser(
        "ablate",
        help="ablate heads and write what changes: per-token losses (or output change), or the induction experiment",
        description="Zero (or mean) ablate heads, i.e. set their slice of the attention output projection's input, "
        "and write per token the loss before and after (models with a language-model head) or the output change "
        "(sentence encoders). With --experiment induction: repeated random tokens, the top-k heads of a role "
        "ablated against k random heads.",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="minilm, smollm2, a hub id or a checkpoint directory")
    parser.add_argument("--text", default=None, help="the text to run (not needed for --experiment)")
    parser.add_argument("--heads", default="", help="heads to ablate: layer.head list, e.g. '3.2,20.5' or 'L3H2 L20H5'")
    parser.add_argument("--ablation", choices=ABLATIONS, default="zero", help="zero, or mean over a reference set")
    parser.add_argument("--engine", choices=ENGINES, default="transformers")
    parser.add_argument(
        "--experiment",
        choices=["induction", "roles"],
        default=None,
        help="induction: repeated random tokens, top-k heads of a role vs k random heads; roles: the heads of "
        "each role in --roles-table ablated together on a corpus, against random heads of the same number",
    )
    parser.add_argument("--roles-table", default=None, help="roles: a per-head table (.csv) with layer, head columns")
    parser.add_argument("--role-column", default=None, help="roles: the table's role column (e.g. primary_role)")
    parser.add_argument(
        "--score-columns", default="", help="roles: comma-separated score columns whose top-k heads form groups"
    )
    parser.add_argument("--corpus", default="ud-ewt-dev", help="roles: the texts the loss is measured on")
    parser.add_argument("--max-sentences", type=int, default=50, help="roles: sentences used (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=5, help="experiment: heads of the role ablated (default 5)")
    parser.add_argument("--draws", type=int, default=4, help="experiment: random-head draws (default 4)")
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_ablate)


def run_ablate(args) -> int:
    import numpy as np

    from .causal import induction_experiment, loss_table, parse_heads, summarize_experiment
    from .corpus import table_format, write_table
    from .errors import HeadscopeError
    from .models import load_model

    table_format(args.out)
    heads = parse_heads(args.heads)
    if args.experiment is None and (not args.text or not heads):
        raise HeadscopeError("give --text and --heads (or --experiment induction / roles)")
    if args.experiment == "roles" and not args.roles_table:
        raise HeadscopeError("--experiment roles needs --roles-table (a per-head table with layer and head columns)")
    model = load_model(args.model, progress=print_progress)
    if args.experiment == "roles":
        import pandas as pd

        from .causal import corpus_texts, group_ablation, head_groups
        from .corpus import read_corpus

        groups = head_groups(
            pd.read_csv(args.roles_table),
            args.role_column,
            [c.strip() for c in args.score_columns.split(",") if c.strip()],
            args.top_k,
        )
        texts = corpus_texts(read_corpus(args.corpus, args.max_sentences))
        table = group_ablation(model, texts, groups, draws=args.draws, ablation=args.ablation, progress=print_progress)
        print(table.drop(columns="head_list").to_string(index=False))
    elif args.experiment == "induction":
        table = induction_experiment(
            model, top_k=args.top_k, random_draws=args.draws, ablation=args.ablation, progress=print_progress
        )
        print(summarize_experiment(table).to_string(index=False))
    else:
        before = model.run(args.text, engine=args.engine)
        after = model.run(args.text, engine=args.engine, ablate=heads, ablation=args.ablation)
        table = loss_table(before, after)
        if after.token_losses is not None:
            finite = np.isfinite(after.token_losses)
            print(
                f"mean loss {np.mean(before.token_losses[finite]):.4f} -> {np.mean(after.token_losses[finite]):.4f} "
                f"nats with {len(heads)} heads {args.ablation}-ablated"
            )
        else:
            print(f"output change (cosine distance of the mean-pooled output): {after.output_change:.4g}")
    print(f"wrote {write_table(table, args.out)}")
    return 0


# ---- importance ---------------------------------------------------------------------------------
def add_importance(subparsers) -> None:
    from .causal import IMPORTANCE_METHODS
    from .models import DEFAULT_MODEL

    parser = subparsers.add_parser(
        "importance",
        help="rank heads by importance (Michel et al. 2019), optionally with the pruning curve",
        description="Head importance |dL/dxi_h| of a gate on each head, summed over the corpus and normalised per "
        "layer (Michel et al. 2019), or the loss change when each head alone is zeroed (--method ablation).",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="minilm, smollm2, a hub id or a checkpoint directory")
    parser.add_argument("--corpus", default="ud-ewt-dev", help="ud-ewt-dev, a .conllu file or a text file")
    parser.add_argument("--max-sentences", type=int, default=100, help="sentences used (default: %(default)s)")
    parser.add_argument("--method", choices=IMPORTANCE_METHODS, default="gradient")
    parser.add_argument("--pruning-out", default=None, help="also write the pruning curve (importance vs random order)")
    parser.add_argument("--steps", type=int, default=10, help="pruning: points after none (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="pruning: random orders (default: %(default)s)")
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_importance)


def run_importance(args) -> int:
    import pandas as pd

    from .causal import corpus_texts, head_importance, pruning_curve
    from .corpus import read_corpus, table_format, write_table
    from .models import load_model

    table_format(args.out)
    if args.pruning_out:
        table_format(args.pruning_out)
    texts = corpus_texts(read_corpus(args.corpus, args.max_sentences))
    model = load_model(args.model, progress=print_progress)
    importance = head_importance(model, texts, method=args.method, progress=print_progress)
    written = [str(write_table(importance, args.out))]
    top = importance.sort_values("importance", ascending=False).head(5)
    print(
        f"{importance.attrs['method']} importance over {len(texts)} texts ({importance.attrs['loss']}); top heads: "
        + ", ".join(f"L{r.layer}H{r.head} {r.importance:.3f}" for r in top.itertuples())
    )
    if args.pruning_out:
        curves = pd.concat(
            [
                pruning_curve(
                    model,
                    texts,
                    order,
                    importance=importance,
                    steps=args.steps,
                    seeds=tuple(range(args.seeds)),
                    progress=print_progress,
                )
                for order in ("importance", "random")
            ],
            ignore_index=True,
        )
        written.append(str(write_table(curves, args.pruning_out)))
    print("wrote " + ", ".join(written))
    return 0


COMMANDS = [add_extract, add_profile, add_ablate, add_importance]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_core", description="Headscope: look inside multi-head attention."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except HeadscopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
