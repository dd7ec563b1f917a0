"""``python -m mha_core`` with bad arguments, as a user types them: every subcommand, every argument (negative,
zero, huge, not a number, odd Unicode, empty; paths that are folders, missing, unwritable, too long; files
that are binary or lack columns; damaged checkpoints). Each ends in one ``error:`` line, never a traceback,
with exit status 2 (bad usage), and a bad path or argument is found before any model loads."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mha_core.__main__ import main
from tests.model_fixtures import build_tiny_bert

# What the command line prints when a model starts loading (``print_progress``).
LOAD_MESSAGE = "] Loading "


def cases(paths: dict[str, str]) -> list[tuple[str, list[str], bool]]:
    """``(id, argv, may load a model)``: every case must fail with status 2; only the cases marked True find
    their error after loading (it depends on the model: its tokenizer, its number of heads, its head)."""
    model = ["--model", paths["bert"]]
    table = ["--out", paths["table"]]
    roles = ["ablate", *model, "--experiment", "roles", "--role-column", "primary_role", *table]
    unwritable = [("proc", "/proc/headscope-test-out"), ("file-as-folder", f"{paths['file']}/sub/out")]
    if os.geteuid() != 0:  # permission bits stop everyone but root
        unwritable.append(("read-only-folder", f"{paths['read_only']}/out"))
    found: list[tuple[str, list[str], bool]] = []

    def add(name: str, argv: list[str], loads: bool = False) -> None:
        found.append((name, argv, loads))

    # ---- the command itself
    add("no-command", [])
    add("unknown-command", ["nope"])
    add("unknown-option", ["extract", "--text", "hi", "--nope"])
    # ---- extract
    extract = ["extract", *model]
    add("extract-no-text", extract)
    for name, text in (("empty", ""), ("spaces", "   "), ("zero-width", "\u200b\u2060"), ("not-unicode", "a\udcff")):
        add(f"extract-text-{name}", [*extract, "--text", text])
    add("extract-text-marks-only", [*extract, "--text", "\u0301\u0301"], loads=True)
    add("extract-text-control-only", [*extract, "--text", "\x01\x02"], loads=True)
    add("extract-pair-empty", [*extract, "--text", "hi", "--pair", ""])
    add("extract-pair-marks-only", [*extract, "--text", "hi", "--pair", "\u0301"], loads=True)
    add("extract-engine", [*extract, "--text", "hi", "--engine", "fast"])
    add("extract-engine-empty", [*extract, "--text", "hi", "--engine", ""])
    for name, model_name in (
        ("empty", ""),
        ("spaces", "  "),
        ("missing-folder", paths["missing"]),
        ("not-a-checkpoint", paths["folder"]),
        ("garbage-weights", paths["garbage"]),
        ("empty-weights", paths["empty_weights"]),
        ("truncated-weights", paths["truncated"]),
        ("huge-name", "x" * 5000),
        ("odd-unicode", "mini\u202elm\u0000"[:-1]),
    ):
        add(f"extract-model-{name}", ["extract", "--model", model_name, "--text", "hi"])
    for name, out in (
        ("folder", paths["folder"]),
        ("empty", ""),
        ("name-too-long", f"{paths['folder']}/{'x' * 300}.npz"),
        ("device", os.devnull),
        *unwritable,
    ):
        add(f"extract-out-{name}", [*extract, "--text", "hi", "--out", out])
    # ---- profile
    profile = ["profile", *model, "--corpus", paths["corpus"]]
    for option in ("--max-sentences", "--batch-size", "--shard-size"):
        for name, value in (("zero", "0"), ("negative", "-3"), ("huge", "9" * 40), ("text", "ten"), ("empty", "")):
            add(f"profile{option}-{name}", [*profile, option, value, *table])
        add(f"profile{option}-superscript", [*profile, option, "\u00b2", *table])
        add(f"profile{option}-fullwidth", [*profile, option, "\uff11\uff12", *table])
    add("profile-batch-size-too-large", [*profile, "--batch-size", "100000000", *table])
    add("profile-workers-without-ray", [*profile, "--workers", "2", *table])
    add("profile-workers-zero", [*profile, "--executor", "ray", "--workers", "0", *table])
    add("profile-worker-threads-negative", [*profile, "--executor", "ray", "--worker-threads", "-1", *table])
    add("profile-executor", [*profile, "--executor", "spark", *table])
    add("profile-column-of-text-file", [*profile, "--column", "text", *table])
    add("profile-column-missing", ["profile", *model, "--corpus", paths["table_corpus"], "--column", "nope", *table])
    for name, corpus in (
        ("missing", paths["missing"]),
        ("folder", paths["folder"]),
        ("binary", paths["binary"]),
        ("binary-csv", paths["binary_csv"]),
        ("binary-conllu", paths["binary_conllu"]),
        ("empty-file", paths["empty_file"]),
        ("empty-name", ""),
    ):
        add(f"profile-corpus-{name}", ["profile", *model, "--corpus", corpus, *table])
    add("profile-model-garbage-weights", ["profile", "--model", paths["garbage"], "--corpus", paths["corpus"], *table])
    for name, out in (("suffix", f"{paths['folder']}/heads.txt"), ("folder", paths["folder_csv"]), *unwritable):
        add(f"profile-out-{name}", [*profile, "--out", out if name != "proc" else out + ".csv"])
    # ---- lab
    for option in ("--steps", "--seed", "--layers", "--heads", "--d-model", "--offset", "--score-every", "--threads"):
        for name, value in (("negative", "-1"), ("huge", "9" * 40), ("text", "x"), ("superscript", "\u00b2")):
            add(
                f"lab{option}-{name}",
                ["lab", option, value, "--steps", "1"] if option != "--steps" else ["lab", option, value],
            )
    for option in ("--layers", "--heads", "--d-model", "--score-every", "--threads"):
        add(f"lab{option}-zero", ["lab", option, "0", "--steps", "1"])
    add("lab-d-model-1e9", ["lab", "--d-model", "1000000000", "--steps", "1"])
    add("lab-too-large-together", ["lab", "--layers", "1000", "--heads", "64", "--d-model", "4096", "--steps", "1"])
    add("lab-d-model-not-divisible", ["lab", "--d-model", "30", "--heads", "4", "--steps", "1"])
    add("lab-offset-past-sequence", ["lab", "--task", "positional", "--offset", "100", "--steps", "1"])
    add("lab-task", ["lab", "--task", "copy", "--steps", "1"])
    add("lab-positions", ["lab", "--positions", "rotary", "--steps", "1"])
    for option in ("--csv", "--save"):
        for name, out in (("folder", paths["folder"]), ("empty", ""), *unwritable):
            add(f"lab{option}-{name}", ["lab", "--steps", "1", option, out])
    add("lab-csv-and-save-same-file", ["lab", "--steps", "1", "--csv", paths["table"], "--save", paths["table"]])
    # ---- ablate
    ablate = ["ablate", *model, "--text", "the cat sat"]
    for name, heads in (
        ("words", "first"),
        ("negative", "-1.1"),
        ("three-parts", "1.2.3"),
        ("superscript", "\u00b9.1"),
    ):
        add(f"ablate-heads-{name}", [*ablate, "--heads", heads, *table])
    add("ablate-heads-out-of-range", [*ablate, "--heads", "99.1", *table], loads=True)
    add("ablate-no-heads", [*ablate, *table])
    add("ablate-no-text", ["ablate", *model, "--heads", "0.1", *table])
    add("ablate-text-empty", ["ablate", *model, "--text", " ", "--heads", "0.1", *table])
    add("ablate-ablation", [*ablate, "--heads", "0.1", "--ablation", "half", *table])
    add("ablate-experiment", [*ablate, "--experiment", "circuits", *table])
    add("ablate-induction-on-an-encoder", ["ablate", *model, "--experiment", "induction", *table], loads=True)
    for option in ("--top-k", "--draws", "--max-sentences"):
        for name, value in (("zero", "0"), ("negative", "-1"), ("huge", "9" * 40), ("text", "five")):
            add(f"ablate{option}-{name}", ["ablate", *model, "--experiment", "induction", option, value, *table])
    for name, out in (("suffix", f"{paths['folder']}/losses.txt"), ("folder", paths["folder_csv"]), *unwritable):
        add(f"ablate-out-{name}", [*ablate, "--heads", "0.1", "--out", out if name != "proc" else out + ".csv"])
    add("ablate-roles-without-table", [*roles])
    for name, roles_table in (
        ("missing", paths["missing"]),
        ("folder", paths["folder"]),
        ("binary", paths["binary_csv"]),
        ("without-columns", paths["other_columns"]),
        ("not-whole-numbers", paths["bad_numbers"]),
        ("only-none", paths["only_none"]),
        ("empty-file", paths["empty_file"]),
    ):
        add(f"ablate-roles-table-{name}", [*roles, "--roles-table", roles_table])
    add("ablate-roles-column-missing", [*roles[:-4], "--role-column", "role", *table, "--roles-table", paths["roles"]])
    add("ablate-roles-no-column", ["ablate", *model, "--experiment", "roles", "--roles-table", paths["roles"], *table])
    add("ablate-roles-score-column-missing", [*roles, "--roles-table", paths["roles"], "--score-columns", "nope"])
    add("ablate-roles-corpus-binary", [*roles, "--roles-table", paths["roles"], "--corpus", paths["binary"]])
    add("ablate-roles-corpus-missing", [*roles, "--roles-table", paths["roles"], "--corpus", paths["missing"]])
    # ---- importance
    importance = ["importance", *model, "--corpus", paths["corpus"]]
    for option in ("--max-sentences", "--steps", "--seeds"):
        for name, value in (("zero", "0"), ("negative", "-2"), ("huge", "9" * 40), ("text", "many")):
            add(f"importance{option}-{name}", [*importance, option, value, *table])
    add("importance-method", [*importance, "--method", "magic", *table])
    for name, corpus in (
        ("missing", paths["missing"]),
        ("binary", paths["binary"]),
        ("empty-file", paths["empty_file"]),
    ):
        add(f"importance-corpus-{name}", ["importance", *model, "--corpus", corpus, *table])
    for option in ("--out", "--pruning-out"):
        for name, out in (("suffix", f"{paths['folder']}/x.txt"), ("folder", paths["folder_csv"]), *unwritable):
            other = [] if option == "--out" else table
            add(f"importance{option}-{name}", [*importance, *other, option, out if name != "proc" else out + ".csv"])
    add("importance-out-and-pruning-same-file", [*importance, *table, "--pruning-out", paths["table"]])
    return found


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    bert = build_tiny_bert(root / "bert")
    damaged = {}
    for name, damage in (
        ("garbage", lambda data: os.urandom(len(data))),
        ("empty_weights", lambda data: b""),
        ("truncated", lambda data: data[: len(data) - 100]),
    ):
        folder = build_tiny_bert(root / name)
        weights = folder / "model.safetensors"
        weights.write_bytes(damage(weights.read_bytes()))
        damaged[name] = str(folder)
    files = {
        "corpus": ("corpus.txt", "The cat sat on the mat.\nA dog ran.\n"),
        "table_corpus": ("corpus.csv", "text\nThe cat sat.\n"),
        "roles": ("roles.csv", "layer,head,primary_role,score\n0,1,sink,0.9\n1,2,broad,0.5\n"),
        "other_columns": ("other.csv", "a,b\n1,2\n"),
        "bad_numbers": ("numbers.csv", "layer,head,primary_role\nfirst,1,sink\n0,1.5,broad\n"),
        "only_none": ("none.csv", "layer,head,primary_role\n0,1,none\n"),
        "empty_file": ("empty.txt", ""),
        "file": ("plain-file", "x"),
    }
    found = {name: str(root / file) for name, (file, _) in files.items()}
    for file, text in files.values():
        (root / file).write_text(text, encoding="utf-8")
    for name, file in (("binary", "binary.bin"), ("binary_csv", "binary.csv"), ("binary_conllu", "binary.conllu")):
        (root / file).write_bytes(bytes(range(256)) * 16)
        found[name] = str(root / file)
    (root / "folder.csv").mkdir()
    read_only = root / "read-only"
    read_only.mkdir(mode=0o500)
    return {
        "bert": str(bert),
        "missing": str(root / "missing" / "nothing.txt"),
        "folder": str(root),
        "folder_csv": str(root / "folder.csv"),
        "read_only": str(read_only),
        "table": str(root / "out" / "table.csv"),
        **damaged,
        **found,
    }


# Run as their own ``python -m mha_core`` process too: every case runs in this process (``main``), and a few,
# one for each way a command line ends that this process cannot show, run as a process (each starts Python and
# torch: about 3 CPU-seconds, and half a minute on a machine with other work on its two cores). What a process
# adds: ``python -m``'s own entry and exit status, output written through a real stderr (text that is not valid
# Unicode must reach it escaped), and what imported libraries print there (transformers and safetensors while a
# damaged checkpoint loads; each subcommand's own imports).
AS_PROCESSES = {
    "no-command",  # argparse's own exit
    "extract-text-not-unicode",  # a lone surrogate, as an undecodable byte of argv becomes, echoed to stderr
    "extract-model-garbage-weights",  # a load that fails inside transformers
    "extract-out-proc",  # an operating system error
    "lab--steps-huge",  # one bad value for each other subcommand
    "ablate-roles-table-binary",
    "profile-corpus-binary",
    "importance--pruning-out-folder",
}
CASE_NAMES = [name for name, _, _ in cases(defaultdict(lambda: "/x"))]


def check_failure(argv: list[str], loads: bool, status: int, stdout: str, stderr: str) -> None:
    """One ``error:`` line, last, no traceback, status 2, nothing on stdout, and (unless ``loads``) no model
    loaded: bad arguments and paths are found in a second, not after the load."""
    shown = f"python -m mha_core {argv!r}:\n{stderr}"
    assert "Traceback" not in stderr, shown
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and stderr.rstrip().splitlines()[-1] == errors[0], shown
    assert status == 2, (status, shown)
    assert stdout == "", stdout
    assert loads or LOAD_MESSAGE not in stderr, shown


@pytest.fixture(scope="module")
def cases_by_name(paths) -> dict[str, tuple[list[str], bool]]:
    return {name: (argv, loads) for name, argv, loads in cases(paths)}


@pytest.fixture(scope="module")
def processes(paths, cases_by_name) -> dict[str, subprocess.CompletedProcess]:
    """The ``AS_PROCESSES`` cases, each run once as ``python -m mha_core ...``, a few at a time."""
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": str(Path(paths["folder"]) / "cache"), "HF_HUB_OFFLINE": "1"}
    env.pop("HEADSCOPE_DEBUG", None)

    def run(name: str):
        command = [sys.executable, "-m", "mha_core", *cases_by_name[name][0]]
        return name, subprocess.run(command, capture_output=True, cwd=paths["folder"], env=env, timeout=600)

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, sorted(AS_PROCESSES)))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_bad_invocation_is_one_error_line_with_status_2(cases_by_name, name, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv, loads = cases_by_name[name]
    status = main(argv)  # an exception escaping ``main`` fails the test: it would be a traceback
    captured = capsys.readouterr()
    check_failure(argv, loads, status, captured.out, captured.err)


@pytest.mark.parametrize("name", sorted(AS_PROCESSES))
def test_a_bad_invocation_in_its_own_process(processes, cases_by_name, name):
    argv, loads = cases_by_name[name]
    done = processes[name]
    stdout, stderr = (stream.decode("utf-8", errors="replace") for stream in (done.stdout, done.stderr))
    check_failure(argv, loads, done.returncode, stdout, stderr)


def test_every_process_case_is_a_case():
    assert set(CASE_NAMES) >= AS_PROCESSES


def test_a_failure_while_running_is_one_error_line_with_status_1(paths, tmp_path, monkeypatch, capsys):
    from mha_core.run import AttentionRun

    def disk_full(self, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(AttentionRun, "save", disk_full)
    out = tmp_path / "run.npz"
    assert main(["extract", "--model", paths["bert"], "--text", "the cat", "--out", str(out)]) == 1
    stderr = capsys.readouterr().err
    assert stderr.splitlines()[-1] == f"error: {os.strerror(errno.ENOSPC)}: {out}"

    def broken(*args, **kwargs):
        raise RuntimeError("an internal\nmistake")

    monkeypatch.setattr("mha_core.models.LoadedModel.run", broken)
    assert main(["extract", "--model", paths["bert"], "--text", "the cat"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "error: unexpected RuntimeError: an internal mistake (HEADSCOPE_DEBUG=1 shows the traceback)"
    monkeypatch.setenv("HEADSCOPE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="an internal"):
        main(["extract", "--model", paths["bert"], "--text", "the cat"])


def test_outputs_in_missing_folders_are_made(paths, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "run.npz"
    assert main(["extract", "--model", paths["bert"], "--text", "the cat", "--out", str(out)]) == 0
    assert out.is_file() and capsys.readouterr().out.rstrip().endswith(f"-> {out}")
