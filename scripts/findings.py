"""Every table of docs/findings/ and the numbers of docs/findings.md, from one place.

    .venv/bin/python scripts/findings.py                  list the targets
    .venv/bin/python scripts/findings.py minilm-profile   write one table (or several, in the order given)
    .venv/bin/python scripts/findings.py all              write every table (SmolLM2's take about an hour here)
    .venv/bin/python scripts/findings.py report           print docs/findings.md's tables from the written files

Each target is one command of the library (``python -m mha_core ...``) or one call of it, printed before it
runs, so a table can also be made by hand. ``report`` runs no model: it reads the tables and prints the
markdown that docs/findings.md quotes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "docs" / "findings"
# Relations shown in the findings' tables: those with at least this many cases in the dev split (roles are
# tried from roles.SYNTACTIC_MIN_COUNT on; the rarer rows show what the held-out test does with them).
SHOWN_MIN_COUNT = 50


def findings_file(name: str) -> str:
    return str((FINDINGS / name).relative_to(ROOT))


@dataclass(frozen=True)
class Target:
    """One table (or pair of tables): made by a command line of ``python -m mha_core`` or by a call."""

    writes: tuple[str, ...]
    command: tuple[str, ...] = ()
    call: Callable[[], None] | None = None
    call_text: str = ""
    needs: tuple[str, ...] = ()  # targets whose tables this one reads ("all" runs them first: TARGETS' order)

    def run(self) -> None:
        if self.command:
            line = [sys.executable, "-m", "mha_core", *self.command]
            print("$ python -m mha_core " + " ".join(self.command), flush=True)
            subprocess.run(line, cwd=ROOT, check=True)
        else:
            print(f">>> {self.call_text}", flush=True)
            self.call()


def minilm_coreference() -> None:
    import mha_core as mc
    from mha_core.corpus.tables import write_table

    write_table(mc.coreference_scores(mc.load_model("minilm")), FINDINGS / "minilm_coreference.csv")


def smollm2_decoder_heads() -> None:
    import mha_core as mc
    from mha_core.corpus.tables import write_table

    scores = mc.decoder_head_scores(mc.load_model("smollm2"), seq_len=50, repeats=2, batch=8, seed=0)
    write_table(scores, FINDINGS / "smollm2_decoder_heads.csv")


# Composition pairs kept in the findings' table: a Q-, K- or V-score at least this many times the random baseline.
COMPOSITION_KEPT_RATIO = 2.0


def smollm2_circuits() -> None:
    import mha_core as mc
    from mha_core.corpus.tables import write_table

    model = mc.load_model("smollm2")
    write_table(mc.copying_scores(model), FINDINGS / "smollm2_copying.csv")
    table = mc.composition(model)
    baseline = table.attrs["baseline"]
    kept = (table["q"] >= COMPOSITION_KEPT_RATIO * baseline["q"]) | (
        table["k"] >= COMPOSITION_KEPT_RATIO * baseline["k"]
    )
    kept |= table["v"] >= COMPOSITION_KEPT_RATIO * baseline["v"]
    write_table(table[kept].round(5), FINDINGS / "smollm2_composition.csv")


# What reaches SmolLM2's indirect-object head 23-3 (issue 34), on the shipped indirect-object prompt pair: a cheap
# pre-screen (attribution patching over heads, one forward and one backward pass) names the REACHES_SENDERS heads
# below layer 23 of the largest total effect; each is path-patched into 23-3 through its query, key and value.
REACHES_RECEIVER = (23, 3)
REACHES_SENDERS = 16


def smollm2_reaches_23_3() -> None:
    import pandas as pd

    import mha_core as mc
    from mha_core.corpus.tables import write_table
    from mha_core.interventions.path_patching import PathPatchRun
    from mha_core.interventions.prompts import CIRCUIT_TASKS

    task = next(task for task in CIRCUIT_TASKS if task.name == "ioi")
    model = mc.load_model("smollm2")
    prompts = (task.clean, task.corrupted, task.answer, task.foil)
    screen = mc.patch(model, *prompts, over="heads", method="attribution", exact_top=0)
    screen = screen[screen["layer"] < REACHES_RECEIVER[0]]
    screen = screen.reindex(screen["score"].abs().sort_values(ascending=False, kind="stable").index)
    senders = [(int(r.layer), int(r.head)) for r in screen.head(REACHES_SENDERS).itertuples()]
    run = PathPatchRun(model, *prompts)
    rows = []
    for via in ("q", "k", "v"):
        metrics = run.patched(senders, [REACHES_RECEIVER], via)
        for (layer, head), metric, score in zip(senders, metrics, run.normalised(metrics), strict=True):
            rows.append((via, layer, head, metric, score))
    table = pd.DataFrame(rows, columns=["via", "layer", "head", "metric", "score"])
    total = screen.set_index(["layer", "head"])["score"]
    table["attribution"] = [total[layer, head] for layer, head in zip(table["layer"], table["head"])]
    table["clean_metric"], table["corrupted_metric"] = run.clean_metric, run.corrupted_metric
    write_table(table.round(6), FINDINGS / "smollm2_reaches_23_3.csv")


# The held-out test's false-positive rate on shuffled trees: MiniLM's heads on the first n dev sentences, each
# sentence's tree shuffled this many times (docs/metrics.md, "The held-out test of a syntactic role").
SHUFFLED_SIZES = {50: 200, 100: 200, 400: 100}
# The size of the held-out test at its boundary, by held-out sentences (stats.margin_test_size).
BOUNDARY_CLUSTERS = (10, 20, 30, 50, 100, 200, 400)
BOUNDARY_SIMULATIONS = 100_000


def minilm_shuffled_trees() -> None:
    import pandas as pd

    import mha_core as mc
    from mha_core.analysis.roles import shuffled_tree_tests
    from mha_core.corpus.measure import word_predictions
    from mha_core.corpus.tables import write_table

    sentences = mc.ud_ewt_dev()[: max(SHUFFLED_SIZES)]
    predictions, has_words = word_predictions(mc.load_model("minilm"), sentences)
    frames = []
    for size, shuffles in SHUFFLED_SIZES.items():
        for how in ("permuted", "random"):
            print(f"  {size} sentences, {shuffles} shuffles ({how})", flush=True)
            table = shuffled_tree_tests(
                predictions[:size], has_words[:size], sentences[:size], shuffles=shuffles, seed=size, how=how
            )
            frames.append(table.assign(sentences=size, how=how))
            write_table(pd.concat(frames, ignore_index=True), FINDINGS / "minilm_shuffled_trees.csv")


def held_out_test_size() -> None:
    import pandas as pd

    from mha_core.analysis.stats import margin_test_size
    from mha_core.corpus.tables import write_table

    rows = [margin_test_size(g, simulations=BOUNDARY_SIMULATIONS, seed=g) for g in BOUNDARY_CLUSTERS]
    write_table(pd.DataFrame(rows), FINDINGS / "held_out_test_size.csv")


# The needle test on SmolLM2 (mha_core.models.long.run_needle): the default needle and question (whose end repeats
# the needle's words, as in Wu et al. 2024) at depths of 10% to 70% (each tenth) and 90% of a 1,024-token haystack
# and at half depth of 2,048 tokens, and once a question that does not end with the needle's words. A trial is 3 to 10
# minutes here; more trials are appended by adding them (a run resumes after the trials the table holds).
PLAIN_QUESTION = "What is the secret password for the garden gate? Answer:"
NEEDLE_TRIALS = (
    *(("wording", 1024, depth) for depth in (0.1, 0.3, 0.5, 0.7, 0.9)),
    ("wording", 2048, 0.5),
    ("plain", 1024, 0.5),
    *(("wording", 1024, depth) for depth in (0.2, 0.4, 0.6)),
)


# ---- MiniLM's roles ablated: the primary roles of section 1, and the offsets-only test's syntactic heads ---------
ROLE_ABLATION_SENTENCES = 50
ROLE_ABLATION_DRAWS = 10
OFFSETS_ONLY = "offsets-only "  # the label of the groups the held-out test named without its word-type control


def offsets_only_primary_roles(heads, dependency):
    """A profile's per-head table with ``primary_role`` as the held-out test makes it on the offsets alone (the
    dependency table without the word-type control's columns): the roles a profile gave before the control."""
    from mha_core.analysis.roles import head_roles, primary_roles
    from mha_core.analysis.syntax import TYPE_CONTROL_COLUMNS

    roles = head_roles(
        None, metrics=heads, dependency=dependency.drop(columns=list(TYPE_CONTROL_COLUMNS), errors="ignore")
    )
    primary = primary_roles(roles, int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1)
    return primary.rename(columns={"role": "primary_role"})


def offsets_only_syntactic_groups(heads, dependency) -> dict[str, list[tuple[int, int]]]:
    """The heads the offsets-only test names syntactic, each in the group of its primary (strongest) such role."""
    from mha_core.interventions.experiments import head_groups

    primary = offsets_only_primary_roles(heads, dependency)
    syntactic = primary[primary["group"] == "syntactic"]
    return {OFFSETS_ONLY + name: group for name, group in head_groups(syntactic, "primary_role").items()}


def minilm_role_ablation() -> None:
    """Each primary role of section 1's table ablated together against random heads of the same number; after them,
    labelled, the heads the offsets-only test called syntactic (by role, then all together)."""
    import pandas as pd

    import mha_core as mc
    from mha_core.corpus.reading import corpus_texts
    from mha_core.corpus.tables import write_table
    from mha_core.interventions.experiments import head_groups
    from mha_core.operations.causal import GroupAblation

    heads = pd.read_csv(FINDINGS / "minilm_ud_ewt_dev_heads.csv")
    dependency = pd.read_csv(FINDINGS / "minilm_ud_ewt_dev_heads.dependency.csv")
    groups = head_groups(heads, "primary_role")
    offsets_only = offsets_only_syntactic_groups(heads, dependency)
    groups.update(offsets_only)
    every = sorted({head for group in offsets_only.values() for head in group})
    groups[f"{OFFSETS_ONLY}syntactic: all {len(every)} heads"] = every
    model = mc.load_model("minilm")
    texts = corpus_texts(mc.read_corpus("ud-ewt-dev", ROLE_ABLATION_SENTENCES))
    table = GroupAblation.of(model, texts, groups, draws=ROLE_ABLATION_DRAWS).run(model)
    print(table.drop(columns="head_list").to_string(index=False))
    write_table(table, FINDINGS / "minilm_role_ablation.csv")


def smollm2_needle() -> None:
    """Each trial of ``NEEDLE_TRIALS`` appended to the table as it finishes (a run of the target resumes after the
    trials the table holds)."""
    import numpy as np
    import pandas as pd

    import mha_core as mc
    from mha_core.analysis.long_roles import retrieval_scores
    from mha_core.corpus.tables import write_table
    from mha_core.models.long import NEEDLE, NEEDLE_QUESTION, haystack, needle_question, run_needle

    path = FINDINGS / "smollm2_needle.csv"
    done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["question", "length", "depth"])
    model = mc.load_model("smollm2")
    questions = {"wording": NEEDLE_QUESTION, "plain": PLAIN_QUESTION}
    for form, length, depth in NEEDLE_TRIALS:
        if ((done["question"] == form) & (done["length"] == length) & (done["depth"] == depth)).any():
            continue
        prompt = needle_question(model, haystack(), NEEDLE, questions[form], depth=depth, num_tokens=length)
        run = run_needle(model, prompt)
        answer = run.metadata["needle"]
        print(f"  {form} question, {length} tokens, depth {depth}: answered {answer.answer!r}", flush=True)
        argmax = run.statistics.rows["argmax"]
        copies = list(answer.copies)
        copied = len({query for query, _ in copies})
        first = [pair for pair in copies if pair[0] == answer.answer_start - 1]
        layers, heads = np.divmod(np.arange(model.num_layers * model.num_heads), model.num_heads)
        trial = pd.DataFrame(
            {
                "question": form,
                "length": length,
                "tokens": run.num_tokens,
                "depth": depth,
                "answer": answer.answer,
                "layer": layers,
                "head": heads,
                "copies": copied,
                "hits": np.rint(retrieval_scores(argmax, copies)["score"].to_numpy() * copied).astype(int)
                if copies
                else 0,
                "first_hit": retrieval_scores(argmax, first)["score"].to_numpy() if first else np.nan,
            }
        )
        done = pd.concat([done, trial], ignore_index=True) if len(done) else trial
        write_table(done, path)


# ---- the score decomposition (mha_core.score_decomposition): what feeds a head's query and key --------------------
# Heads of docs/findings.md's tables: SmolLM2's previous-token heads (previous_token >= 0.4) and induction heads
# (prefix_matching >= 0.4), read from smollm2_decoder_heads.csv; MiniLM's named syntactic heads and their relations.
DECOMPOSITION_CUT = 0.4
MINILM_SYNTAX_HEADS = {"nsubj": (2, 8), "det": (2, 8), "case": (2, 8), "obj": (2, 0)}
MINILM_SYNTAX_SENTENCES = 40  # UD dev sentences searched for each relation's cases
MINILM_SYNTAX_CASES = 25  # cases per relation
SOURCES_SHOWN = 5  # sources per head and side in the tables


def decomposition_rows(parts_list, controls, labels_of_group: dict, head_name: str) -> list[dict]:
    """The mean score over the cases (and over the control keys', where given); per side, each source's mean part,
    the largest ``SOURCES_SHOWN`` by the mean difference (or by the mean part without controls), and each group's
    sum."""
    import numpy as np

    rows = [
        dict(
            head=head_name,
            side="both",
            source="score (the model's)",
            mean_part=round(float(np.mean([p.score for p in parts_list])), 4),
            mean_part_control=round(float(np.mean([p.score for p in controls])), 4) if controls else None,
            cases=len(parts_list),
        )
    ]
    for side in ("query", "key"):
        parts = np.mean([p.side(side).to_numpy() for p in parts_list], axis=0)
        labels = parts_list[0].labels
        control = np.mean([p.side(side).to_numpy() for p in controls], axis=0) if controls else None
        ranking = parts - control if control is not None else parts
        for index in np.argsort(-np.abs(ranking), kind="stable")[:SOURCES_SHOWN]:
            rows.append(
                dict(
                    head=head_name,
                    side=side,
                    source=labels[index],
                    mean_part=round(float(parts[index]), 4),
                    mean_part_control=None if control is None else round(float(control[index]), 4),
                    cases=len(parts_list),
                )
            )
        for group, members in labels_of_group.items():
            chosen = [labels.index(label) for label in members if label in labels]
            rows.append(
                dict(
                    head=head_name,
                    side=side,
                    source=group,
                    mean_part=round(float(parts[chosen].sum()), 4),
                    mean_part_control=None if control is None else round(float(control[chosen].sum()), 4),
                    cases=len(parts_list),
                )
            )
    return rows


def smollm2_induction_decomposition() -> None:
    """SmolLM2's induction heads on the induction prompt: each query in the second copy against the key that followed
    its token's first occurrence (what an induction head attends to), and, as the control, the first occurrence
    itself (the same token: what a duplicate-token head attends to). The difference of the two keys' scores is the
    log of their weights' ratio; the table says which sources make it."""
    import pandas as pd

    import mha_core as mc
    from mha_core.interventions.decomposition import score_decompositions
    from mha_core.interventions.prompts import TASKS_BY_NAME

    heads = pd.read_csv(FINDINGS / "smollm2_decoder_heads.csv")
    previous = heads[heads["previous_token"] >= DECOMPOSITION_CUT]
    induction = heads[heads["prefix_matching"] >= DECOMPOSITION_CUT].sort_values("prefix_matching", ascending=False)
    previous_labels = [f"{layer}-{head}" for layer, head in zip(previous["layer"], previous["head"])]
    model = mc.load_model("smollm2")
    encoded = model.encode(TASKS_BY_NAME["induction"].clean)
    ids = encoded.input_ids
    cells = [
        (query, key)
        for query in range(len(ids))
        for key in range(2, query)
        if ids[key - 1] == ids[query] and key - 1 != query
    ]
    rows = []
    for layer, head in zip(induction["layer"], induction["head"]):
        parts = score_decompositions(model, encoded, [(layer, head, query, key) for query, key in cells])
        controls = score_decompositions(model, encoded, [(layer, head, query, key - 1) for query, key in cells])
        groups = {
            "previous-token heads (sum)": [label for label in previous_labels if int(label.split("-")[0]) < layer]
        }
        rows += decomposition_rows(parts, controls, groups, f"{layer}-{head}")
    table = pd.DataFrame(rows)
    table.to_csv(FINDINGS / "smollm2_induction_decomposition.csv", index=False)
    print(table.to_string())


def minilm_syntax_decomposition() -> None:
    """MiniLM's named syntactic heads on UD dev sentences: each case's query is the dependent's first token, its key
    the parent's first token."""
    import pandas as pd

    import mha_core as mc
    from mha_core.interventions.decomposition import score_decompositions

    model = mc.load_model("minilm")
    sentences = mc.ud_ewt_dev(MINILM_SYNTAX_SENTENCES)
    rows = []
    for relation, (layer, head) in MINILM_SYNTAX_HEADS.items():
        parts = []
        for sentence in sentences:
            encoded = model.encode(sentence.words)
            first = {}
            for position, word in enumerate(encoded.word_ids):
                if word >= 0:
                    first.setdefault(int(word), position)
            cells = [
                (layer, head, first[word], first[parent - 1])
                for word, (parent, name) in enumerate(zip(sentence.heads, sentence.relations))
                if name == relation and parent > 0 and word in first and parent - 1 in first
            ]
            parts += score_decompositions(model, encoded, cells)
            if len(parts) >= MINILM_SYNTAX_CASES:
                break
        rows += [dict(row, relation=relation) for row in decomposition_rows(parts, [], {}, f"{layer}-{head}")]
    table = pd.DataFrame(rows)
    table.to_csv(FINDINGS / "minilm_syntax_decomposition.csv", index=False)
    print(table.to_string())


# ---- which tokens a prediction depends on (issue 33) -------------------------------------------------------------
# How many sentences (SmolLM2: after its circuit prompts) or pairs (MiniLM) the attribution targets read.
ATTRIBUTION_TEXTS = int(os.environ.get("HEADSCOPE_ATTRIBUTION_TEXTS", "200"))
# Methods added to the tables already written, for their texts, without drawing the other methods' curves again
# (``HEADSCOPE_ATTRIBUTION_ADD=value_zeroing``): the references are recomputed for the new rows' agreement.
ATTRIBUTION_ADD = tuple(m for m in os.environ.get("HEADSCOPE_ATTRIBUTION_ADD", "").split(",") if m)
# Continue the tables already written from the first text they do not hold (``HEADSCOPE_ATTRIBUTION_RESUME=1``): a
# run stopped by a time limit is taken up by the next one; the heads' means are combined weighted by texts.
ATTRIBUTION_RESUME = os.environ.get("HEADSCOPE_ATTRIBUTION_RESUME", "") == "1"


def treebank_texts(count: int, min_words: int = 6, max_words: int = 20) -> list[list[str]]:
    """The first ``count`` sentences of the UD EWT dev split with ``min_words`` to ``max_words`` words."""
    from mha_core.analysis.syntax import ud_ewt_dev

    chosen = [s.words for s in ud_ewt_dev() if min_words <= len(s.words) <= max_words]
    return chosen[:count]


def attribution_findings(name: str, items: list) -> None:
    """``attribution_study`` of ``items`` on the model ``name``: the per-text table, its summary and the heads',
    written again after every text (a run cut short leaves the texts it finished, and says how many)."""
    import numpy as np
    import pandas as pd

    import mha_core as mc
    from mha_core.corpus.tables import write_table
    from mha_core.interventions.attribution_study import REFERENCES, attribution_study, study_summary

    model = mc.load_model(name)
    if ATTRIBUTION_ADD:
        add_attribution_methods(model, name, items, ATTRIBUTION_ADD)
        return
    layers, head_ids = np.divmod(np.arange(model.num_layers * model.num_heads), model.num_heads)
    tables, heads, start, earlier = [], [], 0, None
    if ATTRIBUTION_RESUME:
        tables = [pd.read_csv(FINDINGS / f"{name}_token_attribution.csv")]
        start = int(tables[0]["text"].max()) + 1
        kept = pd.read_csv(FINDINGS / f"{name}_token_attribution_heads.csv")
        earlier = np.stack([kept[f"vs_{r}"].to_numpy().reshape(model.num_layers, model.num_heads) for r in REFERENCES])
    for index in range(start, len(items)):
        per_text, text_heads = attribution_study(model, [items[index]])
        tables.append(per_text.assign(text=index))
        heads.append(text_heads)
        done = pd.concat(tables, ignore_index=True)
        write_table(done, FINDINGS / f"{name}_token_attribution.csv")
        write_table(study_summary(done), FINDINGS / f"{name}_token_attribution_summary.csv")
        mean = np.nanmean(np.array(heads), axis=0)
        if earlier is not None:
            mean = (earlier * start + mean * len(heads)) / (start + len(heads))
        columns = {f"vs_{reference}": mean[i].ravel() for i, reference in enumerate(REFERENCES)}
        write_table(
            pd.DataFrame({"layer": layers, "head": head_ids} | columns),
            FINDINGS / f"{name}_token_attribution_heads.csv",
        )
        print(f"  {index + 1}/{len(items)} texts", flush=True)


def add_attribution_methods(model, name: str, items: list, methods: tuple[str, ...]) -> None:
    """``methods``' rows added to (or replaced in) ``name``'s per-text table for the texts it holds, and the summary
    written again, after every text; the heads' table is left as it is (it reads the references only)."""
    import pandas as pd

    from mha_core.corpus.tables import write_table
    from mha_core.interventions.attribution_study import attribution_study, study_summary
    from mha_core.interventions.token_attribution import METHODS

    path = FINDINGS / f"{name}_token_attribution.csv"
    table = pd.read_csv(path)
    table = table[~table["method"].isin(methods)]
    order = {method: index for index, method in enumerate((*METHODS, "random"))}
    texts = sorted(table["text"].unique())
    for done, index in enumerate(texts):
        rows, _ = attribution_study(model, [items[index]], seeds=0, methods=methods)
        table = pd.concat([table, rows.assign(text=index)], ignore_index=True)
        table = table.sort_values(["text", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
        write_table(table.reset_index(drop=True), path)
        write_table(study_summary(table), FINDINGS / f"{name}_token_attribution_summary.csv")
        print(f"  {done + 1}/{len(texts)} texts", flush=True)


def smollm2_token_attribution() -> None:
    """The shipped circuit prompts (their answers explained), then treebank sentences cut before their last word
    (the model's own next token explained)."""
    from mha_core.interventions.prompts import CIRCUIT_TASKS

    items = [(task.clean, task.answer) for task in CIRCUIT_TASKS]
    for words in treebank_texts(ATTRIBUTION_TEXTS):  # the prompts and ATTRIBUTION_TEXTS sentences
        items.append((" ".join(words[:-1]), None))
    attribution_findings("smollm2", items)


def minilm_token_attribution() -> None:
    """Consecutive treebank sentences as pairs: the similarity of each sentence with the next one explained."""
    texts = [" ".join(words) for words in treebank_texts(ATTRIBUTION_TEXTS + 1)]
    attribution_findings("minilm", list(itertools.pairwise(texts)))


def cli(line: str) -> tuple[str, ...]:
    """The words of a ``python -m mha_core`` command line; ``{name}`` stands for ``docs/findings/name``."""
    return tuple(findings_file(word[1:-1]) if word.startswith("{") else word for word in line.split())


TARGETS: dict[str, Target] = {
    "smollm2-token-attribution": Target(
        writes=(
            "smollm2_token_attribution.csv",
            "smollm2_token_attribution_summary.csv",
            "smollm2_token_attribution_heads.csv",
        ),
        call=smollm2_token_attribution,
        call_text="attribution_study(mc.load_model('smollm2'), circuit prompts + treebank prefixes) "
        "-> 'docs/findings/smollm2_token_attribution*.csv'",
    ),
    "minilm-token-attribution": Target(
        writes=(
            "minilm_token_attribution.csv",
            "minilm_token_attribution_summary.csv",
            "minilm_token_attribution_heads.csv",
        ),
        call=minilm_token_attribution,
        call_text="attribution_study(mc.load_model('minilm'), consecutive treebank sentences as pairs) "
        "-> 'docs/findings/minilm_token_attribution*.csv'",
    ),
    "minilm-profile": Target(
        writes=("minilm_ud_ewt_dev_heads.csv", "minilm_ud_ewt_dev_heads.dependency.csv"),
        command=cli("profile --model minilm --corpus ud-ewt-dev --batch-size 16 --out {minilm_ud_ewt_dev_heads.csv}"),
    ),
    "mpnet-profile": Target(
        writes=("mpnet_ud_ewt_dev_heads.csv", "mpnet_ud_ewt_dev_heads.dependency.csv"),
        command=cli(
            "profile --model mpnet --corpus ud-ewt-dev --batch-size 16 --shard-size 100 "
            "--out {mpnet_ud_ewt_dev_heads.csv}"
        ),
    ),
    "minilm-shuffled-trees": Target(
        writes=("minilm_shuffled_trees.csv",),
        call=minilm_shuffled_trees,
        call_text="shuffled_tree_tests(*word_predictions(mc.load_model('minilm'), sentences[:n]), sentences[:n], "
        "shuffles, how=...) for n in SHUFFLED_SIZES, how in ('permuted', 'random') -> "
        "'docs/findings/minilm_shuffled_trees.csv'",
    ),
    "held-out-test-size": Target(
        writes=("held_out_test_size.csv",),
        call=held_out_test_size,
        call_text="margin_test_size(g, simulations=100_000, seed=g) for g in BOUNDARY_CLUSTERS -> "
        "'docs/findings/held_out_test_size.csv'",
    ),
    "minilm-coreference": Target(
        writes=("minilm_coreference.csv",),
        call=minilm_coreference,
        call_text="write_table(mc.coreference_scores(mc.load_model('minilm')), 'docs/findings/minilm_coreference.csv')",
    ),
    "minilm-role-ablation": Target(
        writes=("minilm_role_ablation.csv",),
        call=minilm_role_ablation,
        call_text="GroupAblation.of(minilm, the first ROLE_ABLATION_SENTENCES dev sentences, head_groups(minilm's "
        "profile, 'primary_role') + offsets_only_syntactic_groups(profile, dependency), "
        "draws=ROLE_ABLATION_DRAWS) -> 'docs/findings/minilm_role_ablation.csv'",
        needs=("minilm-profile",),
    ),
    "minilm-importance": Target(
        writes=("minilm_importance.csv", "minilm_pruning.csv"),
        command=cli(
            "importance --model minilm --method ablation --max-sentences 20 --steps 10 --seeds 2 "
            "--out {minilm_importance.csv} --pruning-out {minilm_pruning.csv}"
        ),
    ),
    "smollm2-decoder": Target(
        writes=("smollm2_decoder_heads.csv",),
        call=smollm2_decoder_heads,
        call_text="write_table(mc.decoder_head_scores(mc.load_model('smollm2'), seq_len=50, repeats=2, batch=8, "
        "seed=0), 'docs/findings/smollm2_decoder_heads.csv')",
    ),
    "smollm2-needle": Target(
        writes=("smollm2_needle.csv",),
        call=smollm2_needle,
        call_text="run_needle(model, needle_question(model, haystack(), NEEDLE, question, depth=depth, "
        "num_tokens=length)) for each of NEEDLE_TRIALS -> 'docs/findings/smollm2_needle.csv'",
    ),
    "smollm2-induction-ablation": Target(
        writes=("smollm2_induction_ablation.csv",),
        command=cli(
            "ablate --model smollm2 --experiment induction --top-k 5 --draws 4 --out {smollm2_induction_ablation.csv}"
        ),
    ),
    "smollm2-role-ablation": Target(
        writes=("smollm2_role_ablation.csv",),
        command=cli(
            "ablate --model smollm2 --experiment roles --roles-table {smollm2_decoder_heads.csv} "
            "--score-columns previous_token,duplicate_token,induction --top-k 5 --max-sentences 20 --draws 3 "
            "--out {smollm2_role_ablation.csv}"
        ),
        needs=("smollm2-decoder",),
    ),
    "smollm2-induction-decomposition": Target(
        writes=("smollm2_induction_decomposition.csv",),
        call=smollm2_induction_decomposition,
        call_text="mc.score_decomposition(smollm2, induction prompt, layer, head, query, key) for each induction head "
        "and second-copy query, at the induction key and at the first occurrence -> "
        "'docs/findings/smollm2_induction_decomposition.csv'",
        needs=("smollm2-decoder",),
    ),
    "minilm-syntax-decomposition": Target(
        writes=("minilm_syntax_decomposition.csv",),
        call=minilm_syntax_decomposition,
        call_text="mc.score_decomposition(minilm, UD sentence, layer, head, dependent, parent) for the named syntactic "
        "heads -> 'docs/findings/minilm_syntax_decomposition.csv'",
    ),
    "smollm2-circuits": Target(
        writes=("smollm2_copying.csv", "smollm2_composition.csv"),
        call=smollm2_circuits,
        call_text="write_table(mc.copying_scores(model), 'docs/findings/smollm2_copying.csv'); mc.composition(model) "
        "-> the pairs at 2x the random baseline or more, 'docs/findings/smollm2_composition.csv'",
    ),
    "smollm2-reaches-23-3": Target(
        writes=("smollm2_reaches_23_3.csv",),
        call=smollm2_reaches_23_3,
        call_text="the 16 heads below layer 23 of largest |mc.patch(model, *ioi, method='attribution')|, each "
        "path-patched into 23-3 via q, k, v (PathPatchRun.patched, as mc.path_patch) -> "
        "'docs/findings/smollm2_reaches_23_3.csv'",
    ),
    "smollm2-importance": Target(
        writes=("smollm2_importance.csv", "smollm2_pruning.csv"),
        command=cli(
            "importance --model smollm2 --max-sentences 20 --steps 10 --seeds 2 "
            "--out {smollm2_importance.csv} --pruning-out {smollm2_pruning.csv}"
        ),
    ),
}


# ---- report: the markdown of docs/findings.md ------------------------------------------------------------
def percent(value: float, signed: bool = False) -> str:
    return "-" if value != value else f"{value:+.1%}" if signed else f"{value:.1%}"


def markdown(header: list[str], rows: list[list[str]], right_from: int = 1) -> str:
    align = ["---" if index < right_from else "---:" for index in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def relation_table(dependency, direction: str) -> str:
    """The best head per relation, chosen on the selection half, with both halves and the held-out test: the
    held-out half's best offset (the test's baseline), the selection half's offset scored there, and the held-out
    half's best word-type rule (the word-type control, when the table has its columns)."""
    from mha_core.analysis.roles import SYNTACTIC_MIN_COUNT, best_heldout_heads

    best = best_heldout_heads(dependency, min_count=SHOWN_MIN_COUNT)
    best = best[best["direction"] == direction]
    controlled = "heldout_type_baseline" in best
    rows = []
    for r in best.itertuples():
        if r.count < SYNTACTIC_MIN_COUNT:
            role = f"not tried (n < {SYNTACTIC_MIN_COUNT})"
        elif not r.tested:
            role = f"not tested ({'a ' if controlled else ''}selection margin < +10%)"
        else:
            role = f"**named** (p = {r.holm_p_value:.1g})" if r.named else f"no (p = {min(r.holm_p_value, 1):.2g})"
        rows.append(
            [
                r.relation,
                str(r.count),
                f"{r.layer}-{r.head}",
                f"{percent(r.selection_accuracy)} vs {percent(r.selection_baseline_accuracy)} "
                f"({r.selection_baseline_offset:+d})",
                percent(r.heldout_accuracy),
                f"{percent(r.heldout_baseline_accuracy)} ({r.heldout_baseline_offset:+d})",
                percent(r.heldout_selected_baseline_accuracy),
                f"{percent(r.heldout_margin, True)} ({percent(r.heldout_margin_low, True)} to "
                f"{percent(r.heldout_margin_high, True)})",
                *(
                    [
                        f"{percent(r.heldout_type_baseline_accuracy)} ({type_rule_short(r.heldout_type_baseline)}): "
                        f"{percent(r.type_heldout_margin, True)}"
                    ]
                    if controlled
                    else []
                ),
                str(r.heldout_rank),
                role,
            ]
        )
    header = [
        "relation",
        "n",
        "head",
        "selection half: head vs offset",
        "held-out: head",
        "held-out: best offset",
        "held-out: selection's offset",
        "held-out margin (95% CI)",
        *(["held-out: best word type: margin"] if controlled else []),
        "held-out rank",
        "role (Holm p)",
    ]
    return markdown(header, rows, right_from=1)


def type_rule_short(name: str) -> str:
    """ "nearest NOUN to the left" -> "NOUN <"; "" (no rule found any case) -> "-"."""
    if not name:
        return "-"
    tag, side = name.removeprefix("nearest ").split(" to the ")
    return f"{tag} {'<' if side == 'left' else '>'}"


def whole_corpus_rule(dependency, min_count: int):
    """The rule syntactic roles had before the held-out test, for comparison only: whole-corpus margin >= 0.10
    over the best offset, at least ``min_count`` cases, Wilson interval over cases above the baseline."""
    from mha_core.analysis.roles import SYNTACTIC_MIN_MARGIN
    from mha_core.analysis.stats import wilson_interval

    low, _ = wilson_interval(dependency["accuracy"], dependency["count"])
    return dependency[
        (dependency["accuracy"] - dependency["baseline_accuracy"] >= SYNTACTIC_MIN_MARGIN)
        & (dependency["count"] >= min_count)
        & (low > dependency["baseline_accuracy"])
    ]


def rule_comparison(name: str, dependency, heads) -> list[str]:
    """What the whole-corpus rule and the held-out test name, at the roles' count and at a lower one."""
    from mha_core.analysis.roles import SYNTACTIC_MIN_COUNT, syntactic_tests

    rows = []
    for min_count in (SYNTACTIC_MIN_COUNT, SHOWN_MIN_COUNT):
        old = whole_corpus_rule(dependency, min_count)
        tests = syntactic_tests(dependency, min_count=min_count)
        new = tests[tests["named"]]
        rare = dependency[(dependency["count"] >= min_count) & (dependency["count"] < SYNTACTIC_MIN_COUNT)]
        rare_relations = sorted(set(rare["relation"]))
        rows.append(
            [
                name,
                str(min_count),
                f"{int(tests['tried'].sum())}",
                f"{len(old)} roles on {old[['layer', 'head']].drop_duplicates().shape[0]} heads",
                f"{len(new)} roles on {new[['layer', 'head']].drop_duplicates().shape[0]} heads",
                ", ".join(
                    f"{relation}: {int((old['relation'] == relation).sum())} -> {int((new['relation'] == relation).sum())}"
                    for relation in rare_relations
                )
                or "-",
            ]
        )
    return rows


def stability(dependency) -> str:
    from mha_core.analysis.roles import SYNTACTIC_MIN_COUNT, best_heldout_heads

    best = best_heldout_heads(dependency, min_count=SYNTACTIC_MIN_COUNT)
    parts = []
    for direction in ("parent", "child"):
        rows = best[best["direction"] == direction]
        parts.append(f"{direction}: {int((rows['heldout_rank'] == 1).sum())} of {len(rows)}")
    return "; ".join(parts)


def design_effect(dependency) -> str:
    """How much wider an interval over sentences is than one that takes every case as an independent draw."""
    import numpy as np

    from mha_core.analysis.roles import SYNTACTIC_MIN_COUNT, best_heldout_heads

    best = best_heldout_heads(dependency, min_count=SYNTACTIC_MIN_COUNT)
    accuracy = best["heldout_accuracy"]
    ratio = best["heldout_accuracy_se"] / np.sqrt(accuracy * (1 - accuracy) / best["heldout_count"])
    return f"median {ratio.median():.2f}, from {ratio.min():.2f} to {ratio.max():.2f}"


def role_counts(heads) -> str:
    from mha_core.analysis.roles import ROLE_GROUPS

    family = heads["primary_role"].str.split(":").str[0]
    counts = family.value_counts()
    return ", ".join(f"{counts.get(name, 0)} {name}" for name in ROLE_GROUPS if counts.get(name, 0))


def layer_table(heads) -> str:
    # In these encoders the first token is [CLS] (<s>), a special token: sink mass is special-token mass.
    by_layer = heads.groupby("layer")[["sink_mass", "punctuation_mass", "normalized_entropy"]].mean()
    labels = {
        "sink_mass": "sink mass ([CLS], [SEP])",
        "punctuation_mass": "punctuation mass",
        "normalized_entropy": "normalised entropy",
    }
    rows = [[labels[column], *(f"{value:.2f}" for value in by_layer[column])] for column in labels]
    return markdown(["layer", *(str(layer) for layer in by_layer.index)], rows)


def attribution_table(summary) -> str:
    """docs/findings.md's table of one model's token attribution: per method, the median agreement with integrated
    gradients and with occlusion and the median AOPC, each with its 95% interval, over the texts."""
    from mha_core.interventions.token_attribution import METHOD_LABELS

    def cell(row, column: str) -> str:
        median, low, high = row[column], row[f"{column}_low"], row[f"{column}_high"]
        return "-" if median != median else f"{median:+.2f} [{low:+.2f}, {high:+.2f}]"

    rows = [
        [
            METHOD_LABELS.get(row["method"], "random order"),
            cell(row, "vs_integrated_gradients"),
            cell(row, "vs_occlusion"),
            cell(row, "deletion_aopc"),
            cell(row, "insertion_aopc"),
        ]
        for _, row in summary.iterrows()
    ]
    header = ["method", "Spearman with IG", "Spearman with occlusion", "deletion AOPC", "insertion AOPC"]
    return markdown(header, rows)


# The paired comparisons of docs/findings.md section 11: (first, second) of the attention-based scores.
ATTRIBUTION_PAIRS = (
    ("attention_norms", "attention"),
    ("attention", "rollout"),
    ("attention_norms", "rollout"),
    ("value_zeroing", "attention"),
    ("value_zeroing", "attention_norms"),
    ("value_zeroing", "rollout"),
)


def attribution_pairs(per_text) -> str:
    """Paired comparisons over the texts both methods have: the median of the per-text difference of agreement
    (with integrated gradients, with occlusion) between two scores, and of each method's AOPC minus random
    order's on the same text, each with its 95% interval (``stats.median_interval``) and the number of texts."""
    from mha_core.analysis.stats import median_interval
    from mha_core.interventions.token_attribution import METHOD_LABELS, METHODS

    def cell(first, second) -> str:
        difference = (first - second).dropna()
        median, low, high = median_interval(difference.to_numpy(dtype=float))
        return f"{median:+.2f} [{low:+.2f}, {high:+.2f}] (n={len(difference)})"

    wide = {
        column: per_text.pivot(index="text", columns="method", values=column)
        for column in ("vs_integrated_gradients", "vs_occlusion", "deletion_aopc", "insertion_aopc")
    }
    rows = [
        [f"{METHOD_LABELS[a]} - {METHOD_LABELS[b]}", *(cell(wide[c][a], wide[c][b]) for c in list(wide)[:2]), "-", "-"]
        for a, b in ATTRIBUTION_PAIRS
        if a in wide["vs_occlusion"] and b in wide["vs_occlusion"]
    ]
    rows += [
        [f"{METHOD_LABELS[m]} - random order", "-", "-", *(cell(wide[c][m], wide[c]["random"]) for c in list(wide)[2:])]
        for m in METHODS
        if m in wide["deletion_aopc"].columns
    ]
    header = ["difference", "Spearman with IG", "Spearman with occlusion", "deletion AOPC", "insertion AOPC"]
    return markdown(header, rows)


def attribution_heads(heads, top: int = 5) -> str:
    """The ``top`` heads whose attention row agrees best with integrated gradients and with occlusion."""
    rows = []
    for column in ("vs_integrated_gradients", "vs_occlusion"):
        best = heads.sort_values(column, ascending=False).head(top)
        named = [f"{int(row['layer'])}.{int(row['head'])} ({row[column]:+.2f})" for _, row in best.iterrows()]
        rows.append([column[3:].replace("_", " "), ", ".join(named)])
    return markdown(["reference", f"the {top} heads that agree best (mean Spearman over the texts)"], rows, 2)


def report() -> None:
    import pandas as pd

    from mha_core.analysis.roles import (
        DELIMITER_MIN_MASS,
        POSITIONAL_MIN_SHARE,
        SINK_MIN_MASS,
        SYNTACTIC_ALPHA,
        syntactic_tests,
    )
    from mha_core.analysis.stats import holm_adjusted
    from mha_core.analysis.syntax import TYPE_CONTROL_COLUMNS

    comparison = []
    for name in ("minilm", "mpnet"):
        heads = pd.read_csv(FINDINGS / f"{name}_ud_ewt_dev_heads.csv")
        dependency = pd.read_csv(FINDINGS / f"{name}_ud_ewt_dev_heads.dependency.csv")
        print(f"\n## {name}\n")
        for direction in ("parent", "child"):
            print(f"### {direction}\n\n{relation_table(dependency, direction)}\n")
        print(f"primary roles: {role_counts(heads)}")
        print(f"primary roles on the offsets alone: {role_counts(offsets_only_primary_roles(heads, dependency))}")
        print(f"selection-half best head still best on the held-out half (n >= 100): {stability(dependency)}")
        tests = syntactic_tests(dependency)
        print(
            f"held-out test: {int(tests['tried'].sum())} rows tried, {int(tests['tested'].sum())} tested, "
            f"{int(tests['named'].sum())} named; with Holm over the tested rows only: "
            f"{int((holm_adjusted(tests.loc[tests['tested'], 'p_value']) <= SYNTACTIC_ALPHA).sum())}"
        )
        alone = syntactic_tests(dependency.drop(columns=list(TYPE_CONTROL_COLUMNS), errors="ignore"))
        print(
            f"on the offsets alone: {int(alone['tested'].sum())} tested, {int(alone['named'].sum())} named; with Holm "
            f"over the tested rows only: "
            f"{int((holm_adjusted(alone.loc[alone['tested'], 'p_value']) <= SYNTACTIC_ALPHA).sum())}"
        )
        print(f"interval over sentences / over cases (best heads, n >= 100): {design_effect(dependency)}")
        print(
            f"sink mass >= {SINK_MIN_MASS}: {int((heads['sink_mass'] >= SINK_MIN_MASS).sum())} heads; "
            f"punctuation >= {DELIMITER_MIN_MASS}: {int((heads['punctuation_mass'] >= DELIMITER_MIN_MASS).sum())}; "
            f"positional share >= {POSITIONAL_MIN_SHARE}: "
            + ", ".join(
                f"{r.layer}-{r.head} ({r.argmax_offset:+d}, {r.argmax_offset_share:.1%})"
                for r in heads[heads["argmax_offset_share"] >= POSITIONAL_MIN_SHARE].itertuples()
            )
        )
        print(f"\n{layer_table(heads)}\n")
        comparison += rule_comparison(name, dependency, heads)
    print("\n## whole-corpus rule against the held-out test\n")
    print(
        markdown(
            [
                "model",
                "relations tried from n >=",
                "rows tried",
                "whole-corpus rule",
                "held-out test",
                "rarer relations (roles: whole-corpus rule -> held-out test)",
            ],
            comparison,
            right_from=1,
        )
    )
    coreference = pd.read_csv(FINDINGS / "minilm_coreference.csv").sort_values("accuracy", ascending=False)
    print("\n## minilm coreference\n")
    print(
        markdown(
            ["head", "accuracy", "antecedent over distractor"],
            [
                [f"{r.layer}-{r.head}", percent(r.accuracy), percent(r.candidate_accuracy)]
                for r in coreference.head(4).itertuples()
            ],
        )
    )
    print(f"mean accuracy over heads: {percent(coreference['accuracy'].mean())}")
    print("\n## minilm role ablation\n")
    print(ablation_table(pd.read_csv(FINDINGS / "minilm_role_ablation.csv")))
    print("\n## smollm2 role ablation\n")
    print(ablation_table(pd.read_csv(FINDINGS / "smollm2_role_ablation.csv")))
    induction = pd.read_csv(FINDINGS / "smollm2_induction_ablation.csv")
    print("\n## smollm2 induction ablation\n")
    print(
        markdown(
            ["condition", "heads", "first half", "repeated half"],
            [
                [
                    r.condition + (f", draw {r.draw}" if r.condition != "none" and "random" in r.condition else ""),
                    dashed(r.heads),
                    f"{r.loss_first_half:.2f}",
                    f"{r.loss_repeated_half:.2f}",
                ]
                for r in induction.itertuples()
            ],
            right_from=2,
        )
    )
    print("\n## the held-out test at its boundary (stats.margin_test_size)\n")
    print(size_table(pd.read_csv(FINDINGS / "held_out_test_size.csv")))
    print("\n## the held-out test on shuffled trees (minilm)\n")
    print(shuffled_table(pd.read_csv(FINDINGS / "minilm_shuffled_trees.csv")))
    print("\n## smollm2 needle test\n")
    print(
        needle_summary(
            pd.read_csv(FINDINGS / "smollm2_needle.csv"), pd.read_csv(FINDINGS / "smollm2_decoder_heads.csv")
        )
    )
    for name in ("minilm", "smollm2"):
        pruning = pd.read_csv(FINDINGS / f"{name}_pruning.csv")
        importance = pd.read_csv(FINDINGS / f"{name}_importance.csv")
        print(f"\n## {name} pruning\n")
        print(pruning_table(pruning))
        top = importance.sort_values("importance", ascending=False).head(8)
        print("top importance: " + ", ".join(f"{r.layer}-{r.head} {r.importance:.3f}" for r in top.itertuples()))
        print("raw importance by layer: " + ", ".join(f"{v:.2f}" for v in importance.groupby("layer")["raw"].sum()))
    for name in ("smollm2", "minilm"):
        summary = pd.read_csv(FINDINGS / f"{name}_token_attribution_summary.csv")
        print(f"\n## {name} token attribution ({int(summary['texts'].max())} texts)\n")
        print(attribution_table(summary))
        print()
        print(attribution_pairs(pd.read_csv(FINDINGS / f"{name}_token_attribution.csv")))
        print()
        print(attribution_heads(pd.read_csv(FINDINGS / f"{name}_token_attribution_heads.csv")))


def size_table(size) -> str:
    """The held-out test's rejection rate of a margin on its threshold, by held-out sentences and reference."""
    rows = [
        [str(r.clusters), f"{r.rate_t:.1%}", f"{r.rate_normal:.1%}", f"{r.simulations:,}"] for r in size.itertuples()
    ]
    se = size["monte_carlo_se"].iloc[0]
    return f"Monte Carlo standard error of a rate of 5%: {se:.2%}\n\n" + markdown(
        ["held-out sentences", "Student's t (G - 1 df)", "normal", "simulations"], rows
    )


def shuffled_table(shuffled) -> str:
    """The held-out test on shuffled trees: how often a shuffle names a role, with each reference."""
    from mha_core.analysis.stats import wilson_interval

    rows = []
    for (how, size), part in shuffled.groupby(["how", "sentences"], sort=False):
        shuffles = len(part)
        cells = []
        for column in ("named", "named_normal", "named_offsets"):
            count = int((part[column] > 0).sum())
            _, high = wilson_interval(count / shuffles, shuffles)
            cells.append(f"{count} of {shuffles} ({count / shuffles:.1%}; 95% CI up to {float(high):.1%})")
        rows.append(
            [
                how,
                str(size),
                f"{part['tried'].mean():.0f}",
                f"{part['tested'].mean():.1f}",
                f"{part['tested_offsets'].mean():.1f}",
                *cells,
            ]
        )
    return markdown(
        [
            "trees",
            "sentences",
            "rows tried",
            "rows tested (mean)",
            "rows tested, offsets alone",
            "shuffles naming a role: t (the test)",
            "normal reference",
            "offsets alone (no word-type control)",
        ],
        rows,
        right_from=1,
    )


def needle_summary(needle, decoder) -> str:
    """The needle test on SmolLM2: what it answered, its retrieval heads pooled over the answers that found the
    needle's secret, and how many of them are induction heads (``decoder_head_scores``' induction score at the
    roles' cut-off)."""
    from mha_core.analysis.roles import decoder_min_score
    from mha_core.analysis.stats import wilson_interval
    from mha_core.models.long import NEEDLE

    secret = NEEDLE.rstrip(".").split(" is ")[-1]  # "purple elephant nineteen"
    trials = needle.drop_duplicates(["question", "length", "depth"])
    lines = [
        [
            r.question,
            f"{r.tokens:,}",
            f"{r.depth:.0%}",
            repr(r.answer),
            str(int(r.copies)),
            "yes" if secret in r.answer else "no",
        ]
        for r in trials.itertuples()
    ]
    out = markdown(
        ["question", "tokens", "depth", "answer (greedy)", "answer tokens in the needle", "found the secret"], lines, 3
    )
    found = needle[needle["answer"].str.contains(secret, regex=False)]
    pooled = found.groupby(["layer", "head"])[["hits", "copies"]].sum().reset_index()
    pooled["score"] = pooled["hits"] / pooled["copies"]
    first = found.groupby(["layer", "head"])["first_hit"].agg(["sum", "count"]).reset_index()
    pooled = pooled.merge(first, on=["layer", "head"]).merge(
        decoder[["layer", "head", "induction"]], on=["layer", "head"]
    )
    cut = decoder_min_score("induction")
    induction = pooled[pooled["induction"] >= cut]
    retrieval = pooled[pooled["score"] >= 0.1].sort_values(["score", "layer", "head"], ascending=[False, True, True])
    copies = int(pooled["copies"].iloc[0])
    low, high = wilson_interval(retrieval["score"].to_numpy(), copies)
    rows = [
        [
            f"{r.layer}-{r.head}",
            f"{r.score:.2f} ({lo:.2f}-{hi:.2f})",
            f"{int(r.sum)} of {int(r.count)}",
            f"{r.induction:.2f}" + (" (induction head)" if r.induction >= cut else ""),
        ]
        for r, lo, hi in zip(retrieval.itertuples(), low, high)
    ]
    both = retrieval.merge(induction[["layer", "head"]], on=["layer", "head"])
    rank = pooled[["score", "induction"]].rank().corr().iloc[0, 1]
    return (
        out + f"\n\npooled over the {len(found.drop_duplicates(['question', 'length', 'depth']))} answers that found "
        f"the secret: {copies} answer tokens in the needle\n\n"
        + markdown(["head", "retrieval score (95% CI)", "first answer token copied", "induction score"], rows, 1)
        + f"\n\nretrieval heads (score >= 0.1): {len(retrieval)} of {len(pooled)}; induction heads (induction >= "
        f"{cut:g}): {len(induction)}; both: {len(both)} ("
        + ", ".join(f"{r.layer}-{r.head}" for r in both.itertuples())
        + f"); rank correlation of the two scores over all {len(pooled)} heads: {rank:.2f}"
    )


def dashed(heads: str) -> str:
    """ "L18H6 L17H4" as "18-6 17-4" (layer-head, the findings' notation); "-" stays."""
    return " ".join(h[1:].replace("H", "-") if h.startswith("L") else h for h in heads.split())


def ablation_table(table) -> str:
    """Each group's ablation against random heads of the same number (``causal.group_ablation``)."""
    rows = [
        [
            r.group,
            dashed(r.head_list),
            f"{r.after:.4g}",
            f"{r.after - r.before:+.4g}",
            f"{r.random_mean - r.before:+.4g} +- {r.random_sd:.2g}",
            f"{r.excess:.2f}",
        ]
        for r in table.itertuples()
    ]
    measure = table["measure"].iloc[0]
    return f"{measure}, {table['before'].iloc[0]:.4g} without ablation\n\n" + markdown(
        ["group", "heads", "after", "change", "random heads: change (mean +- sd)", "excess"], rows, right_from=2
    )


def pruning_table(pruning) -> str:
    """Loss as heads go: one row per order (importance, each random seed), one column per step."""
    steps = sorted(pruning["heads_removed"].unique())
    digits = 3 if pruning["loss"].max() < 1 else 2  # an output change (0 to 1) or a loss in nats
    rows = []
    for (order, seed), curve in pruning.groupby(["order", "seed"], sort=False):
        label = "importance order" if order == "importance" else f"random order (seed {seed})"
        losses = curve.set_index("heads_removed")["loss"]
        rows.append([label, *(f"{losses[step]:.{digits}f}" for step in steps)])
    return markdown(["heads removed", *(str(step) for step in steps)], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="targets to make, 'all', or 'report'")
    args = parser.parse_args(argv)
    if not args.targets:
        for name, target in TARGETS.items():
            after = f" (reads the table of {', '.join(target.needs)})" if target.needs else ""
            print(f"{name:<28} writes {', '.join(target.writes)}{after}")
        print(f"{'report':<28} prints docs/findings.md's tables from the written files")
        return 0
    names = list(TARGETS) if args.targets == ["all"] else args.targets
    for name in names:
        if name == "report":
            report()
        elif name in TARGETS:
            TARGETS[name].run()
        else:
            parser.error(f"unknown target {name!r}; run without arguments for the list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
