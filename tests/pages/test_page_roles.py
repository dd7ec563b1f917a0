"""The Roles page under AppTest: no exception, and its figures carry exactly the library's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core
from tests.conftest import ATTENTION_ATOL, LAYOUT_TOL, METRIC_TOL
from tests.page_helpers import figure_spec, open_app

pytestmark = pytest.mark.slow


def chart_specs(at) -> list[dict]:
    return [figure_spec(chart) for chart in at.get("plotly_chart")]


@pytest.fixture(scope="module")
def page(minilm, tmp_path_factory):

    # The corpus profile caches on disk: keep this test's cache out of the user's.
    patch = pytest.MonkeyPatch()
    patch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))

    yield open_app("roles", timeout=600)
    patch.undo()


def expected_for(model, text):
    import mha_core

    run = model.run(text)
    metrics = mha_core.head_metrics(run)
    semantic = mha_core.semantic_scores(run, model.input_embeddings(run.metadata["token_ids"]))
    roles = mha_core.head_roles(run, metrics=metrics, semantic=semantic)
    return run, metrics, roles, mha_core.primary_roles(roles, run.num_layers, run.num_heads)


def test_role_map_is_one_trace_with_the_library_roles(page, minilm):
    from mha_core.analysis.roles import ROLE_GROUPS
    from ui.address import DEFAULT_TEXT
    from ui.figures import plotly_text
    from ui.figures.roles import ROLE_GROUP_LABELS, role_group_codes

    run, _, roles, primary = expected_for(minilm, DEFAULT_TEXT)
    role_map = next(
        s for s in chart_specs(page) if s["data"][0].get("colorbar", {}).get("title", {}).get("text") == "role"
    )
    # The map, its click targets with the group's name in each cell, and the marks of where evidence comes from.
    assert [t["type"] for t in role_map["data"]] == ["heatmap", "scatter", "scatter"]
    z = np.asarray(role_map["data"][0]["z"]).reshape(run.num_layers, run.num_heads)
    np.testing.assert_array_equal(
        z, role_group_codes(primary, run.num_layers, run.num_heads, mha_core.analysis.roles.ROLE_GROUPS)
    )
    assert role_map["data"][0]["colorbar"]["ticktext"] == list(ROLE_GROUPS)
    # Hover: layer, head, role, score with its interval, where it comes from, evidence, as the library gives them;
    # the cell's text names the role group (never a letter alone, which read "s" as "sink").
    targets = role_map["data"][1]
    assert role_map["layout"]["hoverdistance"] == -1 and role_map["data"][0]["hoverinfo"] == "skip"
    for row, custom, label in zip(primary.itertuples(), targets["customdata"], targets["text"]):
        layer, head, role, score, source, evidence = custom
        assert (int(layer), int(head), role) == (row.layer, row.head, row.role)
        assert evidence == plotly_text(row.evidence)  # shown literally, "<" escaped
        assert label == ROLE_GROUP_LABELS[row.group] and (label != "") == (row.group != "none")
        if row.role != "none":
            assert score.startswith(f"score {row.score:.3f}") and source == "from this sentence only"
            assert "95% CI" in score
    assert "sink" in targets["text"] and "s" not in targets["text"]
    # One sentence's evidence carries no corner mark (the marks trace is empty).
    assert len(role_map["data"][2].get("x", [])) == 0
    assert (roles["group"] == "sink").any()  # MiniLM has [CLS]/[SEP] (no-op) heads on any sentence


def test_mds_map_and_diversity_curve_match_head_distances(page, minilm):
    import mha_core
    from ui.address import DEFAULT_TEXT

    run = minilm.run(DEFAULT_TEXT)
    distances = mha_core.head_distances(run)
    specs = chart_specs(page)
    mds = next(s for s in specs if s["layout"].get("xaxis", {}).get("title", {}).get("text") == "MDS 1")
    points = mds["data"][0]
    np.testing.assert_allclose(np.asarray(points["x"]), distances.layout[:, 0], **LAYOUT_TOL)
    np.testing.assert_allclose(np.asarray(points["y"]), distances.layout[:, 1], **LAYOUT_TOL)
    diversity = next(s for s in specs if "Diversity" in s["layout"].get("title", {}).get("text", ""))
    layer_line = diversity["data"][1]
    np.testing.assert_allclose(np.asarray(layer_line["y"]), distances.layer_diversity, **METRIC_TOL)


def test_selecting_a_head_shows_its_attention_and_roles(page, minilm):
    from ui.address import DEFAULT_TEXT

    run, metrics, roles, _ = expected_for(minilm, DEFAULT_TEXT)
    target = roles[roles["layer"] > 0].iloc[0]  # a head with a role, away from the default (0, 0)
    layer, head = int(target["layer"]), int(target["head"])
    page.select_slider(key="layer").set_value(layer).run()
    page.select_slider(key="head").set_value(head).run()
    assert not page.exception
    title = f"Layer {layer} head {head}"
    evidence = next(s for s in chart_specs(page) if title in s["layout"].get("title", {}).get("text", ""))
    z = np.asarray(evidence["data"][0]["z"]).reshape(run.num_tokens, run.num_tokens)
    np.testing.assert_allclose(z, run.attentions[layer, head], rtol=0, atol=ATTENTION_ATOL)
    own = roles[(roles["layer"] == layer) & (roles["head"] == head)]
    tables = [t.value for t in page.dataframe]
    shown = next(t for t in tables if "evidence" in t)
    assert list(shown["role"]) == list(own["role"]) and list(shown["evidence"]) == list(own["evidence"])
    # Each role's evidence also in full below the table (a cell cuts long text).
    captions = [c.value for c in page.caption]
    for role, text in zip(own["role"], own["evidence"]):
        assert f"**{role}**: {text}" in captions
    # Every role shows what it rests on: n, chance level, 95% interval, source.
    # (Floats from the app's run and this one: two float32 computations, compared with METRIC_TOL.)
    for column in ("n", "source"):
        np.testing.assert_array_equal(shown[column].to_numpy(), own[column].to_numpy())
    for column in ("baseline", "ci_low", "ci_high"):
        np.testing.assert_allclose(
            shown[column].to_numpy(dtype=float), own[column].to_numpy(dtype=float), equal_nan=True, **METRIC_TOL
        )
    scores = next(t for t in tables if "measurement" in t)
    entropy = scores.loc[scores["column"] == "normalized_entropy", "value"].iloc[0]
    # Measurements named in words.
    assert scores.loc[scores["column"] == "sink_mass", "measurement"].iloc[0].startswith("attention on positions")
    expected = metrics.loc[(metrics["layer"] == layer) & (metrics["head"] == head), "normalized_entropy"].iloc[0]
    assert float(entropy) == pytest.approx(expected, rel=1e-3)


def test_an_empty_sentence_gives_a_message_not_a_traceback(minilm):
    at = open_app("roles", {"text": " "}, timeout=600)
    assert at.info or at.error


def test_corpus_profile_adds_the_dependency_table_and_its_roles(page, minilm, monkeypatch):
    import mha_core
    from ui.address import DEFAULT_TEXT
    from ui.figures.roles import role_group_codes

    # With the word-type control MiniLM names no syntactic role (docs/findings.md). Tested on the offsets alone,
    # as a table without the control's columns is, its case and obj heads are named, so the page's path for named
    # roles is exercised. Enough sentences for a role to hold on the held-out half after Holm's correction.
    monkeypatch.setattr("mha_core.analysis.roles.TYPE_CONTROL_COLUMNS", ("no word-type control",))
    page.number_input(key="roles_profile_sentences").set_value(300).run()
    page.button(key="roles_profile_button").click().run()
    assert not page.exception, [e.message for e in page.exception]
    result = mha_core.profile(minilm, mha_core.ud_ewt_dev(max_sentences=300), batch_size=16, cache=False)
    coreference = mha_core.coreference_scores(minilm)

    # Both halves of every relation's best head, as the library tests it.
    shown = next(t.value for t in page.dataframe if "relation" in t.value)
    expected = mha_core.best_heldout_heads(result.dependency, min_count=20)
    assert list(shown["relation"]) == list(expected["relation"]) and len(expected) > 0
    # The head written as "L1 H4" (the page shows the role column first, pinned: tests/browser/test_browser.py checks it).
    assert list(shown["head_name"]) == [f"L{r.layer} H{r.head}" for r in expected.itertuples()]
    columns = ("selection_accuracy", "heldout_accuracy", "heldout_baseline_accuracy")
    for column in (*columns, "heldout_selected_baseline_accuracy"):
        np.testing.assert_allclose(shown[column], expected[column], rtol=1e-6)
    assert (shown["heldout_selected_baseline_accuracy"] <= shown["heldout_baseline_accuracy"] + 1e-12).all()
    # The columns written out for the table: each half's head against its offset, the margin with its interval.
    first = expected.iloc[0]
    assert (
        shown["heldout_text"].iloc[0] == f"{first['heldout_accuracy']:.0%} vs {first['heldout_baseline_accuracy']:.0%}"
    )
    assert shown["selected_text"].iloc[0] == f"{first['heldout_selected_baseline_accuracy']:.0%}"
    assert shown["margin_text"].iloc[0] == (
        f"{first['heldout_margin']:+.1%} ({first['heldout_margin_low'] * 100:+.1f}, "
        f"{first['heldout_margin_high'] * 100:+.1f})"
    )
    assert list(shown["named"]) == list(expected["named"]) and shown["named"].any()

    run, metrics, _, _ = expected_for(minilm, DEFAULT_TEXT)
    semantic = mha_core.semantic_scores(run, minilm.input_embeddings(run.metadata["token_ids"]))
    roles = mha_core.head_roles(
        run, metrics=metrics, dependency=result.dependency, coreference=coreference, semantic=semantic
    )
    primary = mha_core.primary_roles(roles, run.num_layers, run.num_heads)
    role_map = next(
        s for s in chart_specs(page) if s["data"][0].get("colorbar", {}).get("title", {}).get("text") == "role"
    )
    z = np.asarray(role_map["data"][0]["z"]).reshape(run.num_layers, run.num_heads)
    np.testing.assert_array_equal(
        z, role_group_codes(primary, run.num_layers, run.num_heads, mha_core.analysis.roles.ROLE_GROUPS)
    )
    # The syntactic roles are exactly the held-out tests that pass.
    tests = mha_core.syntactic_tests(result.dependency)
    named = tests[tests["named"]]
    syntactic = roles[roles["group"] == "syntactic"]
    assert len(syntactic) > 0
    assert sorted(zip(syntactic["layer"], syntactic["head"], syntactic["role"])) == sorted(
        zip(named["layer"], named["head"], "syntactic:" + named["relation"] + ":" + named["direction"])
    )


def test_a_decoder_gets_decoder_scores_in_its_role_map(tmp_path, monkeypatch):
    import mha_core
    from tests.model_fixtures import build_tiny_gpt2
    from ui.figures.roles import role_group_codes

    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    # A random tiny model has no real previous-token head (scores ~0.08); a lower cut-off gives it
    # decoder roles, so the map shows whether the page used the decoder scores at all.
    monkeypatch.setattr("mha_core.analysis.roles.DECODER_MIN_SCORE", 0.05)
    path = str(build_tiny_gpt2(tmp_path / "gpt2"))
    text = "The cat sat on the mat."
    at = open_app("roles", {"model": path, "text": text}, timeout=600)
    at.number_input(key="roles_profile_sentences").set_value(10).run()
    at.button(key="roles_profile_button").click().run()
    assert not at.exception, [e.message for e in at.exception]

    model = mha_core.load_model(path)
    run = model.run(text)
    decoder = mha_core.decoder_head_scores(model)
    result = mha_core.profile(model, mha_core.ud_ewt_dev(max_sentences=10), cache=False)
    roles = mha_core.head_roles(
        run,
        metrics=mha_core.head_metrics(run),
        dependency=result.dependency,
        coreference=mha_core.coreference_scores(model),
        decoder=decoder,
        semantic=mha_core.semantic_scores(run, model.input_embeddings(run.metadata["token_ids"])),
    )
    primary = mha_core.primary_roles(roles, run.num_layers, run.num_heads)
    role_map = next(
        s for s in chart_specs(at) if s["data"][0].get("colorbar", {}).get("title", {}).get("text") == "role"
    )
    z = np.asarray(role_map["data"][0]["z"]).reshape(run.num_layers, run.num_heads)
    np.testing.assert_array_equal(
        z, role_group_codes(primary, run.num_layers, run.num_heads, mha_core.analysis.roles.ROLE_GROUPS)
    )
    hover = {(int(c[0]), int(c[1])): c for c in role_map["data"][1]["customdata"]}
    decoder_heads = primary[primary["group"] == "decoder"]
    assert len(decoder_heads) > 0
    for row in decoder_heads.itertuples():
        assert "repeated random tokens" in hover[(row.layer, row.head)][5]
        assert hover[(row.layer, row.head)][4] == "from repeated random tokens"
    # Each decoder head carries a diamond in its cell's corner (evidence from random tokens), clickable as its cell.
    marks = role_map["data"][2]
    diamonds = {
        (int(c[0]), int(c[1]))
        for c, symbol in zip(marks["customdata"], marks["marker"]["symbol"])
        if symbol == "diamond"
    }
    assert diamonds == set(zip(decoder_heads["layer"], decoder_heads["head"]))
