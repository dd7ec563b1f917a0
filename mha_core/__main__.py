"""Command line: ``python -m mha_core <command> ...``.

Each command is one ``add_<command>(subparsers)`` function that registers its arguments and a
handler; ``COMMANDS`` lists them. Adding a command is adding one such function to the list.

Every failure is one line on stderr, ``error: ...``, never a traceback. Exit status 2: the command was
used wrongly (an argument, a path, a file, the model or the text given; a ``HeadscopeError``); 1: it
failed while running (a file could not be written, memory ran out, an unexpected error, whose traceback
``HEADSCOPE_DEBUG=1`` prints); 130: stopped by Ctrl-C. A handler checks every argument and path it can
before it loads a model (a bad ``--out`` is found in a second), and numbers are bounded where they
decide what is allocated (``whole_number``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .corpus.reading import corpus_texts, read_corpus
from .corpus.shards import DEFAULT_SHARD_SIZE, check_profile_settings, shards_in_cache
from .corpus.tables import head_table, profile_summary, write_table
from .errors import HeadscopeError, quoted
from .interventions.experiments import head_groups, summarize_experiment
from .interventions.importance import IMPORTANCE_METHODS
from .interventions.joint_qk import DEFAULT_MAX_POINTS
from .interventions.joint_qk import METHODS as JOINT_METHODS
from .interventions.patching import DEFAULT_BATCH_SIZE, DEFAULT_EXACT_TOP, PATCH_METHODS, PATCH_OVER
from .interventions.prompts import TASKS_BY_NAME
from .lab import MAX_SEED, POSITIONS, TASKS, Lab, LabConfig, lab_summary
from .models import DEFAULT_MODEL, ENGINES, load_model, sources
from .models.ablation import ABLATIONS, parse_heads
from .models.generation import MAX_NEW_TOKENS, check_sampling
from .models.outputs import loss_table
from .models.tokens import check_text
from .operations import (
    AblationEffect,
    Attention,
    Attribution,
    Generation,
    GroupAblation,
    Importance,
    InductionExperiment,
    JointQueryKey,
    LabTraining,
    Operation,
    Patching,
    Prediction,
    Profile,
    prompt,
)
from .progress import Progress, fraction
from .run import AttentionRun
from .seq2seq_run import Seq2SeqRun
from .views import images, standalone

EXIT_USAGE, EXIT_FAILURE, EXIT_INTERRUPTED = 2, 1, 130
TABLE_SUFFIXES = (".csv", ".parquet")
MAX_THREADS = 256  # torch threads, Ray actors
# Sentences per forward pass: at 64 tokens a sentence holds 4.4 MB of SmolLM2's attention, 1.1 GB for 256.
MAX_BATCH_SIZE = 256
MAX_CORPUS_SENTENCES = 10**6  # commands that hold their corpus in memory (ablate, importance)


class UsageError(HeadscopeError):
    """The command line itself is wrong: an argument, a path, a file it names."""


class CommandParser(argparse.ArgumentParser):
    """argparse, with its errors as one ``UsageError`` line instead of a usage block and ``sys.exit``."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def whole_number(minimum: int, maximum: int):
    """An argparse type: an ASCII whole number within ``minimum..maximum`` (``int()`` alone takes "１２"
    and "٣", and no bound: ``--d-model 1000000000`` would be allocated)."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[-+]?[0-9]{1,30}\s*", text):
            raise argparse.ArgumentTypeError(f"not a whole number: {quoted(text, 40)}")
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be between {minimum:,} and {maximum:,}, got {value:,}")
        return value

    parse.__name__ = "whole number"  # what argparse calls the type in its messages
    return parse


def check_output(path: str | None, option: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """``path`` (None: not asked for) made sure to be writable before any slow work: a file name (not a
    folder, a device or a name too long) ending in one of ``suffixes``, whose nearest existing folder
    takes a new file (tried with a temporary file: permission bits, read-only mounts and /proc alike).
    Missing folders are made when the file is written (``write_output``)."""
    if path is None:
        return None
    if not path.strip():
        raise UsageError(f"{option} is empty: give a file name")
    target = Path(path).expanduser()
    if suffixes and target.suffix.lower() not in suffixes:
        raise UsageError(f"{option} must end in {' or '.join(suffixes)}, got {quoted(target.name, 80)}")
    try:
        if target.is_dir():
            raise UsageError(f"{option} {quoted(path)} is a folder: give a file name in it")
        if target.exists() and not target.is_file():
            raise UsageError(f"{option} {quoted(path)} is not a regular file (a device or a pipe)")
        folder = target.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise UsageError(f"{option} {quoted(path)}: {quoted(str(folder))} is a file, not a folder")
        longest = os.pathconf(folder, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
        if any(len(part.encode("utf-8", "surrogateescape")) > longest for part in target.parts):
            raise UsageError(f"{option} {quoted(path)}: a name in it is longer than {longest} bytes")
        with tempfile.TemporaryFile(dir=folder, prefix=".headscope-write-test-"):
            pass
        if target.exists():
            with open(target, "ab"):  # appends nothing: an existing file must be writable too
                pass
    except OSError as exc:
        raise UsageError(f"{option} {quoted(path)} cannot be written: {exc.strerror or exc}") from exc
    return target


def check_distinct(**paths: Path | None) -> None:
    """Two outputs of one command must be two files."""
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        resolved = path.resolve()
        if resolved in seen:
            raise UsageError(f"{seen[resolved]} and {option} name the same file, {quoted(str(path))}")
        seen[resolved] = option


def check_input_file(path: str, option: str) -> Path:
    """``path`` names a readable file."""
    source = Path(path).expanduser()
    try:
        if not source.is_file():
            raise UsageError(f"{option} {quoted(path)} is not a file")
        with open(source, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise UsageError(f"{option} {quoted(path)} cannot be read: {exc.strerror or exc}") from exc
    return source


def write_output(path: Path, write) -> Path:
    """``write(path)``, making the missing folders of ``path`` first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path)
    return path


def check_model(name: str) -> None:
    """What can be known of ``--model`` in milliseconds, before loading it: a name, and for a checkpoint
    folder its config.json and whole safetensors files (the checks ``load_model`` makes first)."""

    name = name.strip()
    if not name:
        raise UsageError("--model is empty: name minilm, smollm2, mpnet, a hub id or a checkpoint folder")
    if name.lower() in sources.EMBEDDED_MODELS:
        return
    checkpoint = sources.resolve(name)  # folders and hub ids: no build, no network
    sources.checkpoint_weight_names(checkpoint.source, name)


def loaded_model(name: str):
    """``load_model(name)`` with progress on stderr, and each of its warnings there as one ``warning:`` line: the
    messages the app shows for it (e.g. a config that names code of its own, never run)."""
    model = load_model(name, progress=print_progress)
    for warning in getattr(model, "warnings", None) or ():
        print(f"warning: {one_line(warning)}", file=sys.stderr, flush=True)
    return model


def print_progress(done: float, total: float, message: str = "") -> None:
    """Progress on stderr, so stdout stays the one-line result."""

    print(f"[{fraction(done, total):4.0%}] {message}", file=sys.stderr, flush=True)


def load_compute_write(name: str, build, write, progress: Progress | None = print_progress, interrupted=None) -> int:
    """What every command that reads a model does, once its arguments and paths are checked: ``--model`` checked
    (``check_model``) and loaded (``loaded_model``), the operation ``build(model)`` made (``mha_core.operations``:
    the same objects the app runs, their input tokenized once) and run with ``progress``, then ``write(value)``
    (the tables and the one-line result). ``interrupted(model, operation)``: what Ctrl-C during the run says and
    returns (None: it ends the command, ``main`` says so)."""
    check_model(name)
    model = loaded_model(name)
    operation: Operation = build(model)
    try:
        value = operation.run(model, progress)
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        return interrupted(model, operation)
    write(value)
    return 0


# ---- extract ------------------------------------------------------------------------------------
MODEL_HELP = "minilm, smollm2, mpnet, a Hugging Face model id, or a checkpoint directory"
CORPUS_HELP = (
    "ud-ewt-dev (the shipped UD English EWT dev split, with POS tags), a .conllu file, a .csv or .parquet table (its "
    "sentences in {column}), or a text file with one sentence per line"
)


def add_model_option(parser, default: str = DEFAULT_MODEL, what: str = MODEL_HELP) -> None:
    """``--model``: which model a command loads (``what`` it may be), its default said in the help."""
    parser.add_argument("--model", default=default, help=f"{what} (default: %(default)s)")


def add_corpus_options(parser, *, sentences: int | None, most: int, column: bool = True, use: str = "") -> None:
    """``--corpus`` (ud-ewt-dev by default), ``--column`` (where the command reads tables by column) and
    ``--max-sentences`` (the first ``sentences``, at most ``most``; None: all); ``use``: what the corpus is for, before
    each help ("roles: ")."""
    where = "the column --column names" if column else "the column 'text'"
    corpus_help = CORPUS_HELP.format(column=where)
    parser.add_argument("--corpus", default="ud-ewt-dev", help=f"{use}{corpus_help} (default: %(default)s)")
    if column:
        parser.add_argument(
            "--column", default=None, help="the sentences' column of a .csv or .parquet corpus (default: 'text')"
        )
    parser.add_argument(
        "--max-sentences",
        type=whole_number(1, most),
        default=sentences,
        help=f"{use}the first N sentences"
        + (" (default: %(default)s)" if sentences is not None else " (default: all)"),
    )


def add_extract(subparsers) -> None:

    parser = subparsers.add_parser(
        "extract",
        help="attention of every layer and head for one text, saved as .npz",
        description="Run one text (or a sentence pair, for encoders) through a model and save the AttentionRun.",
    )
    add_model_option(parser)
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

    check_text(args.text, "text")
    if args.pair is not None:
        check_text(args.pair, "pair text")
    out = check_output(args.out, "--out")

    def write(run) -> None:
        if out is not None:
            write_output(out, run.save)
        print(run.summary() + (f" -> {args.out}" if out is not None else ""))

    return load_compute_write(
        args.model, lambda model: Attention.of(model, args.text, args.pair, engine=args.engine), write, progress=None
    )


# ---- profile ------------------------------------------------------------------------------------
def add_profile(subparsers) -> None:

    parser = subparsers.add_parser(
        "profile",
        help="measure every head over a corpus (metrics, roles, dependency accuracy), saved as a table",
        description="Run a corpus through a model in batches and write one row per head. With trees "
        "(ud-ewt-dev or a .conllu file) the Clark et al. dependency accuracy goes to "
        "<out>.dependency.<ext> as well. The corpus is profiled in shards, each cached as soon as "
        "it is done: a second run is instant, and an interrupted run (Ctrl-C) resumes when the same "
        "command is run again.",
    )
    add_model_option(parser)
    add_corpus_options(parser, sentences=None, most=10**12)  # files are read lazily, never all in memory
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, MAX_BATCH_SIZE),
        default=16,
        help="sentences per forward pass (default: %(default)s)",
    )
    parser.add_argument(
        "--shard-size",
        type=whole_number(1, 10**7),
        default=DEFAULT_SHARD_SIZE,
        help="sentences per shard, the unit that is cached and resumed (default: %(default)s)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute even when a cached profile exists, and cache nothing (no resume)",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: in this process; ray: on Ray actors, each loading the model once (default: %(default)s)",
    )
    parser.add_argument(
        "--workers", type=whole_number(1, MAX_THREADS), default=None, help="Ray actors (--executor ray; default: 2)"
    )
    parser.add_argument(
        "--worker-threads",
        type=whole_number(1, MAX_THREADS),
        default=1,
        help="CPUs each Ray actor reserves, and torch threads it runs (--executor ray; default: %(default)s)",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="an existing Ray cluster ('auto', 'ray://head:10001'); default: a local cluster of --workers CPUs",
    )
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_profile)


def run_profile(args) -> int:

    out = check_output(args.out, "--out", TABLE_SUFFIXES)  # fail before the slow part
    check_profile_settings(args.batch_size, args.shard_size)
    if args.executor == "local" and (args.workers is not None or args.address is not None or args.worker_threads != 1):
        raise HeadscopeError("--workers, --worker-threads and --address need --executor ray")
    settings = dict(column=args.column, max_sentences=args.max_sentences, batch_size=args.batch_size)
    settings.update(shard_size=args.shard_size, cache=not args.no_cache, executor=args.executor)
    settings.update(workers=args.workers, threads=args.worker_threads, address=args.address)
    if next(iter(Profile(args.model, args.corpus, **settings).sentences()), None) is None:  # reads one sentence
        raise UsageError(f"the corpus {quoted(args.corpus)} holds no sentences")

    def interrupted(model, operation: Profile) -> int:
        if args.no_cache:
            print("interrupted: nothing was kept (--no-cache)", file=sys.stderr)
        else:
            kept, total = shards_in_cache(
                model, operation.sentences(), batch_size=args.batch_size, shard_size=args.shard_size
            )
            print(
                f"interrupted: {kept} of {total} shards are done and kept in the cache; run the same command "
                "again to resume from them",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED  # the shell's code for a run stopped by Ctrl-C

    def write(result) -> None:
        written = [str(write_table(head_table(result), out))]
        if result.dependency is not None:
            written.append(str(write_table(result.dependency, dependency_path(out))))
        print(profile_summary(result))
        print("wrote " + ", ".join(written))

    bar = None  # sentences, advanced shard by shard (the total is known once the corpus has been planned)

    def advance(done: float, total: float, message: str = "") -> None:
        nonlocal bar
        bar = bar if bar is not None else tqdm(total=None, unit="sentence", file=sys.stderr)
        if bar.total != total:
            bar.total = total
        bar.set_postfix_str(message, refresh=False)
        bar.update(done - bar.n)

    def build(model) -> Profile:
        return Profile(model.name, args.corpus, **settings)

    try:
        return load_compute_write(args.model, build, write, progress=advance, interrupted=interrupted)
    finally:
        if bar is not None:
            bar.close()


def dependency_path(out: Path) -> Path:
    """Where ``profile`` writes the dependency table of the heads table ``out``."""
    return out.with_name(f"{out.stem}.dependency{out.suffix}")


# ---- lab ----------------------------------------------------------------------------------------
def add_lab(subparsers) -> None:

    defaults = LabConfig()
    parser = subparsers.add_parser(
        "lab",
        help="train a tiny transformer on a task and watch its heads specialise",
        description="Train a small causal transformer built from mha_core.MultiHeadAttention and score "
        "its heads as they grow (induction: previous-token and induction heads; positional: a head "
        "at offset -k; largest: a head that finds the largest token). Prints the final scores.",
    )
    parser.add_argument("--task", choices=TASKS, default=defaults.task, help="default: %(default)s")
    parser.add_argument(
        "--steps", type=whole_number(0, 10**8), default=1500, help="training steps (default: %(default)s)"
    )
    parser.add_argument("--seed", type=whole_number(0, MAX_SEED), default=defaults.seed, help="default: %(default)s")
    # Bounds of their own; together they are bounded by LabConfig (a training step's memory).
    parser.add_argument(
        "--layers", type=whole_number(1, 1024), default=defaults.num_layers, help="default: %(default)s"
    )
    parser.add_argument("--heads", type=whole_number(1, 4096), default=defaults.num_heads, help="default: %(default)s")
    parser.add_argument(
        "--d-model", type=whole_number(1, 1 << 20), default=defaults.d_model, help="default: %(default)s"
    )
    parser.add_argument("--mlp", action="store_true", help="add an MLP to every block (default: attention only)")
    parser.add_argument("--positions", choices=POSITIONS, default=defaults.positions, help="default: %(default)s")
    parser.add_argument(
        "--offset",
        type=whole_number(1, 10**6),
        default=defaults.offset,
        help="positional task: k, below the sequence length (default: %(default)s)",
    )
    parser.add_argument(
        "--score-every",
        type=whole_number(1, 10**8),
        default=25,
        help="score the heads every N steps (default: %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=whole_number(1, MAX_THREADS),
        default=None,
        help="torch threads (a run is reproducible per seed and thread count)",
    )
    parser.add_argument(
        "--csv",
        default=None,
        help="write the history in long form: step, seconds, loss, repeated_loss, layer, head, role, score",
    )
    parser.add_argument("--save", default=None, help="save a checkpoint (.pt, loadable with weights_only=True)")
    parser.set_defaults(handler=run_lab)


def run_lab(args) -> int:

    csv = check_output(args.csv, "--csv")
    save = check_output(args.save, "--save")
    check_distinct(**{"--csv": csv, "--save": save})
    config = LabConfig(
        task=args.task,
        num_layers=args.layers,
        num_heads=args.heads,
        d_model=args.d_model,
        mlp=args.mlp,
        positions=args.positions,
        offset=args.offset,
        seed=args.seed,
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    lab = Lab(config)
    with tqdm(total=args.steps, unit="step", file=sys.stderr) as bar:

        def advance(done: float, total: float, message: str = "") -> None:
            bar.set_postfix_str(message, refresh=False)
            bar.update(done - bar.n)

        try:
            LabTraining(config, args.steps, args.score_every).run(lab, advance)
        except KeyboardInterrupt:
            print(f"interrupted at step {lab.step}: writing what was trained", file=sys.stderr)
    print(lab_summary(lab))
    written = []
    if csv is not None:
        written.append(str(write_output(csv, lambda path: lab.history().to_csv(path, index=False))))
    if save is not None:
        written.append(str(write_output(save, lab.save)))
    if written:
        print("wrote " + ", ".join(written))
    return 0


# ---- ablate -------------------------------------------------------------------------------------
def add_ablate(subparsers) -> None:

    parser = subparsers.add_parser(
        "ablate",
        help="ablate heads and write what changes: per-token losses (or output change), or the induction experiment",
        description="Zero (or mean) ablate heads, i.e. set their slice of the attention output projection's input, "
        "and write per token the loss before and after (models with a language-model head) or the output change "
        "(sentence encoders). With --experiment induction: repeated random tokens, the top-k heads of a role "
        "ablated against k random heads.",
    )
    add_model_option(parser)
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
    parser.add_argument(
        "--roles-table", default=None, help="roles: a per-head table (.csv or .parquet) with layer, head columns"
    )
    parser.add_argument("--role-column", default=None, help="roles: the table's role column (e.g. primary_role)")
    parser.add_argument(
        "--score-columns", default="", help="roles: comma-separated score columns whose top-k heads form groups"
    )
    add_corpus_options(parser, sentences=50, most=MAX_CORPUS_SENTENCES, column=False, use="roles: ")
    parser.add_argument(
        "--top-k", type=whole_number(1, 10**6), default=5, help="experiment: heads of the role ablated (default 5)"
    )
    parser.add_argument(
        "--draws", type=whole_number(1, 10**4), default=4, help="experiment: random-head draws (default 4)"
    )
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_ablate)


def run_ablate(args) -> int:

    out = check_output(args.out, "--out", TABLE_SUFFIXES)
    heads = parse_heads(args.heads)
    if args.experiment is None:
        if not args.text or not heads:
            raise UsageError("give --text and --heads (or --experiment induction / roles)")
        check_text(args.text, "text")
    if args.experiment == "roles":
        groups = roles_table_groups(args.roles_table, args.role_column, args.score_columns, args.top_k)
        texts = corpus_texts(read_corpus(args.corpus, args.max_sentences))
    settings = dict(draws=args.draws, ablation=args.ablation)

    def build(model) -> Operation:
        if args.experiment == "roles":
            return GroupAblation.of(model, texts, groups, **settings)
        if args.experiment == "induction":
            return InductionExperiment(model.name, top_k=args.top_k, **settings)
        return AblationEffect(model.name, model.encode(args.text), heads, args.ablation, args.engine)

    def write(value) -> None:
        if args.experiment == "roles":
            table = value
            print(table.drop(columns="head_list").to_string(index=False))
        elif args.experiment == "induction":
            table = value
            print(summarize_experiment(table).to_string(index=False))
        else:
            before, after = value
            table = loss_table(before, after)
            if after.token_losses is not None:
                finite = np.isfinite(after.token_losses)
                print(
                    f"mean loss {np.mean(before.token_losses[finite]):.4f} -> "
                    f"{np.mean(after.token_losses[finite]):.4f} nats with {len(heads)} heads {args.ablation}-ablated"
                )
            else:
                print(f"output change (cosine distance of the mean-pooled output): {after.output_change:.4g}")
        print(f"wrote {write_table(table, out)}")

    return load_compute_write(args.model, build, write)


def roles_table_groups(path: str | None, role_column: str | None, score_columns: str, top_k: int) -> dict:
    """``ablate --experiment roles``: the groups of heads of a per-head table (``causal.head_groups``), read
    and checked before the model loads."""

    if not path:
        raise UsageError("--experiment roles needs --roles-table (a per-head table with layer and head columns)")
    source = check_input_file(path, "--roles-table")
    scores = [c.strip() for c in score_columns.split(",") if c.strip()]
    if role_column is None and not scores:
        raise UsageError("--experiment roles needs --role-column (e.g. primary_role) or --score-columns")
    try:
        table = pd.read_parquet(source) if source.suffix.lower() == ".parquet" else pd.read_csv(source)
    except (ValueError, OSError) as exc:  # not text, not a table: UnicodeDecodeError, ParserError, EmptyDataError
        raise UsageError(f"--roles-table {quoted(path)} is not a readable table ({type(exc).__name__})") from exc
    missing = [column for column in ("layer", "head") if column not in table.columns]
    if missing:
        raise UsageError(
            f"--roles-table {quoted(path)} has no {' and no '.join(missing)} column: it needs one row per head with "
            f"layer and head (a profile's table); it has {', '.join(map(repr, table.columns[:10]))}"
        )
    numbers = table[["layer", "head"]].apply(pd.to_numeric, errors="coerce")
    if numbers.isna().any().any() or (numbers % 1 != 0).any().any() or (numbers < 0).any().any():
        raise UsageError(f"--roles-table {quoted(path)}: layer and head must be whole numbers of at least 0")
    groups = head_groups(table.assign(layer=numbers["layer"], head=numbers["head"]), role_column, scores, top_k)
    if not groups:
        raise UsageError(f"--roles-table {quoted(path)} names no group of heads (every role is 'none' or empty)")
    return groups


# ---- importance ---------------------------------------------------------------------------------
def add_importance(subparsers) -> None:

    parser = subparsers.add_parser(
        "importance",
        help="rank heads by importance (Michel et al. 2019), optionally with the pruning curve",
        description="Head importance |dL/dxi_h| of a gate on each head, summed over the corpus and normalised per "
        "layer (Michel et al. 2019), or the loss change when each head alone is zeroed (--method ablation).",
    )
    add_model_option(parser)
    add_corpus_options(parser, sentences=100, most=MAX_CORPUS_SENTENCES, column=False)
    parser.add_argument("--method", choices=IMPORTANCE_METHODS, default="gradient")
    parser.add_argument("--pruning-out", default=None, help="also write the pruning curve (importance vs random order)")
    parser.add_argument(
        "--steps", type=whole_number(1, 10**4), default=10, help="pruning: points after none (default: %(default)s)"
    )
    parser.add_argument(
        "--seeds", type=whole_number(1, 10**4), default=3, help="pruning: random orders (default: %(default)s)"
    )
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")
    parser.set_defaults(handler=run_importance)


def run_importance(args) -> int:

    out = check_output(args.out, "--out", TABLE_SUFFIXES)
    pruning_out = check_output(args.pruning_out, "--pruning-out", TABLE_SUFFIXES)
    check_distinct(**{"--out": out, "--pruning-out": pruning_out})
    texts = corpus_texts(read_corpus(args.corpus, args.max_sentences))  # the corpus checked before the model loads
    settings = dict(method=args.method, corpus=args.corpus, steps=args.steps, seeds=args.seeds)

    def build(model) -> Importance:
        return Importance(model.name, args.max_sentences, pruning=args.pruning_out is not None, **settings)

    def write(value) -> None:
        importance, curves = value
        written = [str(write_table(importance, out))]
        top = importance.sort_values("importance", ascending=False).head(5)
        print(
            f"{importance.attrs['method']} importance over {len(texts)} texts ({importance.attrs['loss']}); top "
            "heads: " + ", ".join(f"L{r.layer}H{r.head} {r.importance:.3f}" for r in top.itertuples())
        )
        if curves is not None:
            written.append(str(write_table(curves, pruning_out)))
        print("wrote " + ", ".join(written))

    return load_compute_write(args.model, build, write)


# ---- attribute and patch (circuits) -------------------------------------------------------------
def add_prompt_arguments(parser, pair: bool) -> None:
    """The prompt(s), answer and foil of ``attribute`` and ``patch``, or a shipped task that gives them."""
    add_model_option(parser, "smollm2", "a decoder with its LM head: smollm2, a GPT-2 or Llama checkpoint")
    parser.add_argument(
        "--task",
        choices=sorted(TASKS_BY_NAME),
        default=None,
        help="a shipped prompt pair (docs/circuits.md) instead of the prompts, answer and foil",
    )
    if pair:
        parser.add_argument("--clean", default=None, help="the prompt whose behaviour is patched in")
        parser.add_argument("--corrupted", default=None, help="the prompt it is patched into (same token count)")
    else:
        parser.add_argument("--text", default=None, help="the prompt")
    parser.add_argument("--answer", default=None, help="the right next token, one token (e.g. ' Mary')")
    parser.add_argument(
        "--foil", default=None, help="the wrong next token it is compared with" + ("" if pair else " (optional)")
    )
    parser.add_argument("--out", required=True, help="output table, .csv or .parquet")


def prompt_settings(args, pair: bool) -> dict:
    """The prompts, answer and foil from the arguments or ``--task`` (arguments given win), checked."""
    task = TASKS_BY_NAME[args.task] if args.task else None
    names = ("clean", "corrupted", "answer", "foil") if pair else ("text", "answer", "foil")
    settings = {}
    for name in names:
        value = getattr(args, name)
        if value is None and task is not None:
            value = getattr(task, "clean" if name == "text" else name)
        settings[name] = value
    required = [name for name in names if settings[name] is None and (pair or name != "foil")]
    if required:
        raise UsageError(f"give --{' and --'.join(required)} (or --task: {', '.join(sorted(TASKS_BY_NAME))})")
    for name in names[:2] if pair else names[:1]:
        check_text(settings[name], f"{name} prompt" if pair else "text")
    return settings


def add_attribute(subparsers) -> None:
    parser = subparsers.add_parser(
        "attribute",
        help="direct logit attribution: what every head and MLP writes towards an answer (over a foil)",
        description="Split the logit of --answer (minus --foil's) at the last position into the terms of the "
        "residual stream: the embeddings, every head, every MLP and the biases, through the final norm with its "
        "scale frozen from the run. The rows add up to the model's own logit difference.",
    )
    add_prompt_arguments(parser, pair=False)
    parser.add_argument(
        "--position", type=whole_number(-(10**6), 10**6), default=-1, help="the position predicting (default: last)"
    )
    parser.set_defaults(handler=run_attribute)


def run_attribute(args) -> int:
    out = check_output(args.out, "--out", TABLE_SUFFIXES)
    settings = prompt_settings(args, pair=False)

    def build(model) -> Attribution:
        encoded = prompt(model, settings["text"])
        return Attribution(model.name, encoded, settings["answer"], settings["foil"], position=args.position)

    return load_compute_write(args.model, build, lambda table: print_attribution(table, out))


def print_attribution(table: pd.DataFrame, out: Path) -> None:
    """The attribution's largest terms on stdout, and its table written to ``out``."""
    top = table.reindex(table["contribution"].abs().sort_values(ascending=False).index).head(5)
    named = ", ".join(
        f"{r.component}"
        + ("" if pd.isna(r.layer) else f" L{r.layer}")
        + ("" if pd.isna(r.head) else f"H{r.head}")
        + f" {r.contribution:+.3f}"
        for r in top.itertuples()
    )
    versus = "" if table.attrs["foil"] is None else f" - logit({table.attrs['foil']!r})"
    print(
        f"logit({table.attrs['answer']!r}){versus} = {table.attrs['logit_difference']:.4f} = sum of "
        f"{len(table)} terms ({table['contribution'].sum():.4f}); largest: {named}"
    )
    print(f"wrote {write_table(table, out)}")


def add_patch(subparsers) -> None:
    parser = subparsers.add_parser(
        "patch",
        help="activation patching: which heads (layers, positions) carry the difference between two prompts",
        description="Run the corrupted prompt with one component's output replaced by the clean prompt's, for every "
        "component, and write the logit difference of --answer over --foil as a score: 0 = the corrupted run, "
        "1 = the clean run. --method attribution estimates every score from one forward and one backward pass "
        "and patches its top components exactly beside it.",
    )
    add_prompt_arguments(parser, pair=True)
    parser.add_argument("--over", choices=PATCH_OVER, default="heads", help="default: %(default)s")
    parser.add_argument("--method", choices=PATCH_METHODS, default="exact", help="default: %(default)s")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="transformers",
        help="core: exact patching over heads in the from-scratch engine (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, MAX_BATCH_SIZE),
        default=DEFAULT_BATCH_SIZE,
        help="patched runs per forward pass (default: %(default)s)",
    )
    parser.add_argument(
        "--top",
        type=whole_number(0, 10**6),
        default=DEFAULT_EXACT_TOP,
        help="attribution: components patched exactly beside the estimate (default: %(default)s)",
    )
    parser.set_defaults(handler=run_patch)


def run_patch(args) -> int:
    out = check_output(args.out, "--out", TABLE_SUFFIXES)
    settings = prompt_settings(args, pair=True)

    def build(model) -> Patching:
        clean, corrupted = (
            prompt(model, settings["clean"], "clean prompt"),
            prompt(model, settings["corrupted"], "corrupted prompt"),
        )
        options = dict(over=args.over, method=args.method, batch_size=args.batch_size, exact_top=args.top)
        return Patching(
            model.name, clean, corrupted, settings["answer"], settings["foil"], engine=args.engine, **options
        )

    def write(table: pd.DataFrame) -> None:
        label = {"heads": "head", "layers": "component", "positions": "position"}[args.over]
        top = table.sort_values("score", ascending=False).head(5)
        named = ", ".join(f"L{r.layer} {label} {getattr(r, label)} {r.score:.3f}" for r in top.itertuples())
        print(
            f"{args.method} patching over {args.over}: metric {table.attrs['corrupted_metric']:.3f} (corrupted) -> "
            f"{table.attrs['clean_metric']:.3f} (clean); top: {named}"
        )
        print(f"wrote {write_table(table, out)}")

    return load_compute_write(args.model, build, write)


# ---- render -------------------------------------------------------------------------------------
def add_render(subparsers) -> None:

    parser = subparsers.add_parser(
        "render",
        help="a view as one self-contained HTML file (and a PNG picture), from a text or a saved run",
        description="Draw the head view (or the model view, an encoder-decoder's cross-attention) of a text or of "
        "a run saved by `extract` as ONE HTML file: the data and the scripts inside, nothing fetched when it is "
        "opened, interactive offline (click heads, switch layers). --png also photographs it with Chromium.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to run")
    source.add_argument("--run", help="a run saved by `extract --out` (.npz)")
    add_model_option(parser, what=f"with --text: {MODEL_HELP}")
    parser.add_argument("--pair", default=None, help="with --text: a second text, [SEP]-separated (encoders only)")
    parser.add_argument("--engine", choices=ENGINES, default="transformers", help="with --text: the engine")
    parser.add_argument("--view", choices=VIEW_CHOICES, default="head", help="head view or model view (default: head)")
    parser.add_argument("--layer", type=whole_number(0, 10_000), default=0, help="the layer shown first (default: 0)")
    parser.add_argument("--head", type=whole_number(0, 10_000), default=0, help="the head shown first (default: 0)")
    parser.add_argument("--out", required=True, help="the HTML file to write (.html)")
    parser.add_argument("--png", default=None, help="also a PNG picture of the view (Chromium through Playwright)")
    parser.set_defaults(handler=run_render)


VIEW_CHOICES = ("head", "model")


def saved_run(path: Path):
    """A run saved by ``extract`` (or an encoder-decoder's), with a usage error for any other file."""
    errors = []
    for kind in (AttentionRun, Seq2SeqRun):
        try:
            return kind.load(path)
        except (ValueError, KeyError, OSError, EOFError) as exc:
            errors.append(exc)
    raise UsageError(f"--run {quoted(str(path))} is not a run saved by `extract --out`: {one_line(errors[0], 200)}")


def run_render(args) -> int:

    out = check_output(args.out, "--out", (".html", ".htm"))
    png = check_output(args.png, "--png", (".png",))
    check_distinct(**{"--out": out, "--png": png})
    options = {"layer": args.layer, "head": args.head, "view": args.view}

    def write(run) -> None:
        try:
            view = standalone.view_of(run, **options)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        write_output(out, view.save)
        if png is not None:
            write_output(png, lambda path: images.view_png(view, path))
        size = out.stat().st_size
        print(
            f"{view.title}, {args.view} view -> {args.out} ({size / 2**20:.2f} MB)" + (f", {args.png}" if png else "")
        )

    if args.run is not None:
        write(saved_run(check_input_file(args.run, "--run")))
        return 0
    check_text(args.text, "text")
    if args.pair is not None:
        check_text(args.pair, "pair text")
    return load_compute_write(
        args.model, lambda model: Attention.of(model, args.text, args.pair, engine=args.engine), write, progress=None
    )


# ---- predict, generate ----------------------------------------------------------------------------
def add_predict(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="the model's most likely next tokens (decoders) or words at [MASK] (masked language models)",
        description="The k most likely tokens after --text (a masked model: at its mask token), with their "
        "probabilities (softmax of the model's logits over the whole vocabulary) and logits.",
    )
    add_model_option(parser, "smollm2", "a model with its language-model head")
    parser.add_argument("--text", required=True, help="the text whose next token (or mask) is predicted")
    parser.add_argument("--k", type=whole_number(1, 1000), default=10, help="how many tokens (default: %(default)s)")
    parser.add_argument("--out", default=None, help="also write the table (.csv or .parquet)")
    parser.set_defaults(handler=run_predict)


def run_predict(args) -> int:
    check_text(args.text, "text")
    out = check_output(args.out, "--out", TABLE_SUFFIXES)

    def write(table: pd.DataFrame) -> None:
        for row in table.itertuples():
            print(f"{row.rank:>4}  {row.probability:.4f}  {row.logit:8.3f}  {row.token!r}")
        if out is not None:
            print(f"wrote {write_table(table, out)}")

    return load_compute_write(args.model, lambda model: Prediction.of(model, args.text, k=args.k), write)


def add_generate(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="a decoder writes after a prompt, every head's attention kept (saved as .npz)",
        description="Write up to --tokens tokens after --prompt with the key/value cache; the run over prompt and "
        "written tokens (with each step's distribution in its metadata) is what one pass over them gives.",
    )
    add_model_option(parser, "smollm2", "a decoder with its head")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--tokens", type=whole_number(0, MAX_NEW_TOKENS), default=20, help="at most this many")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=whole_number(1, 10**6), default=None, help="draw from the k most likely")
    parser.add_argument("--top-p", type=float, default=None, help="draw from the most likely summing to p")
    parser.add_argument("--seed", type=whole_number(0, 2**31 - 1), default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default=None, help="where to save the run (.npz); omit to print the text only")
    parser.set_defaults(handler=run_generate)


def run_generate(args) -> int:
    check_text(args.prompt, "prompt")
    check_sampling(args.temperature, args.top_k, args.top_p)
    out = check_output(args.out, "--out")

    def build(model) -> Generation:
        settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        return Generation.of(model, args.prompt, max_new_tokens=args.tokens, **settings)

    def write(run) -> None:
        start = run.metadata["generation"]["prompt_tokens"]
        print(run.text)
        print(f"{run.num_tokens - start} tokens written ({run.metadata['generation']['stopped']})")
        if out is not None:
            write_output(out, run.save)
            print(f"wrote {out}")

    return load_compute_write(args.model, build, write)


# ---- joint-qk ------------------------------------------------------------------------------------
def add_joint_qk(subparsers) -> None:
    parser = subparsers.add_parser(
        "joint-qk",
        help="one head's queries and keys over a corpus in one 2-D projection (AttentionViz), as a table",
        description="Read the head's query and key vectors over a corpus (rotated in rotary models), move the keys "
        "onto the queries' centre and scale both to one mean norm (no attention weight changes), project them "
        "together and write one row per query and per key: kind, sentence, position, token, POS tag, x, y "
        "(docs/joint_qk.md).",
    )
    add_model_option(parser)
    parser.add_argument("--layer", type=whole_number(0, 10**6), required=True)
    parser.add_argument("--head", type=whole_number(0, 10**6), required=True)
    add_corpus_options(parser, sentences=40, most=10**6)
    parser.add_argument("--method", choices=list(JOINT_METHODS), default="pca", help="default: %(default)s")
    parser.add_argument(
        "--max-points",
        type=whole_number(2, 10**7),
        default=DEFAULT_MAX_POINTS,
        help="at most this many queries, and as many keys (default: %(default)s)",
    )
    parser.add_argument("--raw", action="store_true", help="project the vectors as they are (no translation, no scale)")
    parser.add_argument("--engine", choices=ENGINES, default="transformers", help="default: %(default)s")
    parser.add_argument("--out", required=True, help="the table (.csv or .parquet)")
    parser.set_defaults(handler=run_joint_qk)


def run_joint_qk(args) -> int:
    out = check_output(args.out, "--out", TABLE_SUFFIXES)
    sentences = read_corpus(args.corpus, args.max_sentences, args.column)
    settings = dict(method=args.method, normalize=not args.raw, max_points=args.max_points, engine=args.engine)

    def build(model) -> JointQueryKey:
        return JointQueryKey.of(model, sentences, args.layer, args.head, **settings)

    def write(view) -> None:
        kept = "" if view.explained_variance is None else f"; the axes keep {sum(view.explained_variance):.0%}"
        print(f"head {view.layer}-{view.head}: {len(view.table) // 2} queries and as many keys by {view.method}{kept}")
        print(f"wrote {write_table(view.table, out)}")

    return load_compute_write(args.model, build, write)


COMMANDS = [
    add_extract,
    add_profile,
    add_ablate,
    add_importance,
    add_lab,
    add_attribute,
    add_patch,
    add_predict,
    add_generate,
    add_render,
    add_joint_qk,
]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m mha_core", description="Headscope: look inside multi-head attention.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def one_line(text, limit: int = 600) -> str:
    """A message as one printable line of at most ``limit`` characters (a parser's message may quote
    bytes of a binary file)."""
    line = "".join(ch if ch.isprintable() else " " for ch in " ".join(str(text).split()))
    return line if len(line) <= limit else line[:limit] + "…"


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (module docstring). Every failure is one ``error:`` line on stderr."""
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except HeadscopeError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (``| head``): nothing more to say, and nowhere to say it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except MemoryError:
        print("error: out of memory: try fewer sentences, a smaller batch or a smaller model", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # writing an output: a full disk, a folder removed meanwhile
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {one_line(exc.strerror or exc)}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:
        if os.environ.get("HEADSCOPE_DEBUG"):
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {one_line(exc, 300)} (HEADSCOPE_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
