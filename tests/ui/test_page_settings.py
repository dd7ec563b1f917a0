"""Settings declared once per page (ui/page_settings.py) and each page's logic without AppTest: the declarations
read every link tests/page_links.py writes, refuse bad values with the notices the pages show, and write the
same link back; the pages' logic functions return the numbers an independent computation gives."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pandas as pd
import pytest

import mha_core
from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from mha_core.interventions.prompts import TASKS_BY_NAME
from tests.model_fixtures import build_tiny_gpt2
from tests.page_links import LINKS
from ui import address, i18n, page_circuits, page_classroom, page_compare, page_lab, page_positions, page_roles
from ui import page_ablate as ablate
from ui.page_ablate import AblateSettings
from ui.page_circuits import CircuitsSettings
from ui.page_classroom import ClassroomSettings
from ui.page_compare import CompareSettings
from ui.page_deeper import DeeperSettings
from ui.page_explore import ALL_TOKENS, ExploreSettings, focus_choices
from ui.page_lab import LabSettings
from ui.page_positions import PositionsSettings
from ui.page_roles import RolesSettings
from ui.page_settings import Declared, PageSettings
from ui.widgets.pickers import SHARED_INDEX_KEYS

# Each page's settings, and the parsers of the settings whose range follows the model (MiniLM and the default
# sentence, as tests/page_links.py's links are opened with; SmolLM2 for Circuits).
PAGES = {
    "ablate": (AblateSettings, {"heads": address.head_names(6, 12), "later_layer": address.number(1, 5)}),
    "circuits": (CircuitsSettings, {}),
    "classroom": (
        ClassroomSettings,
        {
            "head": address.choice(range(3)),
            "attr_model": address.choice(["smollm2", "minilm", "mpnet"]),
            "dec_layer": address.number(0, 29),  # SmolLM2's layers
        },
    ),
    "compare": (
        CompareSettings,
        {
            "other_model": address.choice(["minilm", "smollm2", "mpnet"]),
            **{
                name: lambda raw: address.index_number(raw, 6, "layer")
                for name in ("left_layer", "right_layer", "other_layer")
            },
        },
    ),
    "explore": (
        ExploreSettings,
        {
            "focus": address.choice(range(ALL_TOKENS, 12)),
            "score_query": address.choice(range(14)),  # the link's sentence and pair: 14 tokens
            "score_key": address.choice(range(14)),
            "written": address.choice([4, 5]),  # the positions SmolLM2 writes (the link explore-writing)
            "long_doc": address.choice(["0", "1", "2", "paste", "needle"]),  # SmolLM2, a decoder: the needle test
            "needle_tokens": address.number(256, 8192),  # up to SmolLM2's context
            "attr_reference": address.choice(["integrated_gradients", "occlusion", "gradient_x_input"]),
        },
    ),
    "deeper": (
        DeeperSettings,
        {
            "layer": lambda raw: address.index_number(raw, 6, "layer"),
            "head": lambda raw: address.index_number(raw, 12, "head"),
            "query": address.choice(range(7)),
        },
    ),
    "lab": (LabSettings, {}),
    "positions": (PositionsSettings, {"channels": address.choices(range(32)), "k": address.number(-7, 100_000)}),
    "roles": (RolesSettings, {"measure": address.choice(["confidence", "normalized_entropy"])}),
}


def link(name: str):
    return next(item for item in LINKS if item.name == name)


# ---- the machinery --------------------------------------------------------------------------------------
def test_a_declaration_parses_and_writes_its_kind_with_the_address_parsers():
    number = Declared("k", "k", "number", 3, minimum=1, maximum=10)
    assert number.parser()("7") == 7 and number.format(7) == "7"
    for bad in ("0", "11", "²", "+1", " 2", "3.5"):
        with pytest.raises(ValueError, match="a whole number from 1 to 10"):
            number.parser()(bad)
    assert number.parser(maximum=20)("15") == 15  # a bound that follows the model
    flag = Declared("f", "f", "flag", False)
    assert (flag.parser()("1"), flag.format(True), flag.format(False)) == (True, "1", "0")
    choices = Declared("c", "c", "choices", [], options={1: "one", 4: "four"})
    assert choices.parser()("4,1") == [4, 1] and choices.format([4, 1]) == "4,1" and choices.format([]) == "none"
    text = Declared("t", "t", "text", "")
    assert text.parser()("x" * (address.MAX_TEXT_CHARS + 5)) == "x" * address.MAX_TEXT_CHARS


def test_a_page_settings_class_without_declarations_has_none():
    @dataclasses.dataclass(frozen=True)
    class Empty(PageSettings):
        plain: int = 1

    assert Empty.declarations() == {} and Empty().to_address() == {}


# ---- Ablate -----------------------------------------------------------------------------------------------
def test_ablate_settings_read_the_ablate_link_and_write_it_back():
    page = link("ablate")
    chosen, notices = AblateSettings.from_address(page.link_query, **PAGES["ablate"][1])
    assert notices == []
    by_key = {d.key: name for name, d in AblateSettings.declarations().items()}
    for setting in page.settings:
        assert getattr(chosen, by_key[setting.key]) == setting.value, setting.url_key
        assert AblateSettings.declarations()[by_key[setting.key]].url_key == setting.url_key
    assert chosen.to_address() == {s.url_key: s.link for s in page.settings}
    assert chosen.chosen == [(0, 1), (2, 3)]
    assert AblateSettings().to_address() == {}  # the defaults leave the link empty


def test_ablate_settings_refuse_bad_values_with_a_notice_and_keep_the_default():
    query = {"top": "²", "ablation": "half", "orders": "11", "heads": "L0H1,L9H0", "method": "gradient"}
    chosen, notices = AblateSettings.from_address(query, **PAGES["ablate"][1])
    assert (chosen.top_k, chosen.ablation, chosen.orders) == (5, "zero", 3)
    assert chosen.heads == ["L0H1"]  # the model's heads kept, the others named
    assert notices[0] == "The link's top=² is not a whole number from 1 to 999999999; using the default."
    assert notices[1].startswith("The link's heads=L0H1,L9H0: ") and notices[1].endswith("; kept L0H1.")
    assert "L9H0" in notices[1]
    assert notices[2] == "The link's ablation=half is not one of zero, mean; using the default."
    assert notices[3] == "The link's orders=11 is not a whole number from 1 to 10; using the default."
    assert len(notices) == 4


def test_a_click_on_a_head_adds_it_or_takes_it_away():
    assert ablate.toggled([], "L1H2") == ["L1H2"]
    assert ablate.toggled(["L0H0", "L1H2"], "L1H2") == ["L0H0"]
    assert ablate.toggled(["L0H0"], "L3H1") == ["L0H0", "L3H1"]


def test_pick_the_strongest_takes_the_largest_scores_ties_in_head_order():
    rng = np.random.default_rng(3)
    values = rng.random((3, 4))
    values[2, 1] = values[0, 3]  # a tie: the earlier head first
    names = ablate.head_names(3, 4)
    assert names[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"] and len(names) == 12
    flat = [(float(values[l, h]), l * 4 + h) for l in range(3) for h in range(4)]
    expected = [names[i] for _, i in sorted(flat, key=lambda item: (-item[0], item[1]))[:5]]
    assert ablate.strongest(values, names, 5) == expected
    assert ablate.strongest(values, names, 12)[-1] == names[int(np.argmin(values))]


def test_later_layers_start_after_the_first_ablated_head():
    assert ablate.later_layers([(2, 1), (4, 0)], 6) == (3, 5)
    assert ablate.later_layers([(5, 1)], 6) is None


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return mha_core.load_model(str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True)))


def test_mean_losses_average_the_tokens_the_ablated_run_has_a_loss_for(tiny_gpt2):
    text = "The cat sat on the mat."
    before = tiny_gpt2.run(text, losses=True)
    after = tiny_gpt2.run(text, ablate=[(0, 1), (1, 3)], losses=True)
    mean_before, mean_after = ablate.mean_losses(before, after)
    kept = [i for i, loss in enumerate(after.token_losses) if np.isfinite(loss)]
    assert 0 < len(kept) < after.num_tokens  # the first token has no loss
    assert mean_before == pytest.approx(sum(before.token_losses[i] for i in kept) / len(kept), rel=1e-6)
    assert mean_after == pytest.approx(sum(after.token_losses[i] for i in kept) / len(kept), rel=1e-6)
    assert mean_after != pytest.approx(mean_before)


# ---- Head roles ------------------------------------------------------------------------------------------
def test_roles_heldout_rows_write_each_half_and_the_margin_out():
    best = pd.DataFrame(
        {
            "layer": [3, 1],
            "head": [4, 0],
            "selection_accuracy": [0.684, np.nan],
            "selection_baseline_accuracy": [0.4, 0.25],
            "heldout_accuracy": [0.61, 0.3],
            "heldout_baseline_accuracy": [0.42, 0.31],
            "heldout_selected_baseline_accuracy": [0.405, 0.2],
            "heldout_margin": [0.19, np.nan],
            "heldout_margin_low": [0.123, np.nan],
            "heldout_margin_high": [0.2571, np.nan],
        }
    )
    rows = page_roles.heldout_rows(best)
    assert list(rows["head_name"]) == ["L3 H4", "L1 H0"]
    assert list(rows["selection_text"]) == ["68% vs 40%", "- vs 25%"]
    assert list(rows["heldout_text"]) == ["61% vs 42%", "30% vs 31%"]
    assert list(rows["selected_text"]) == ["40%", "20%"]
    assert list(rows["margin_text"]) == ["+19.0% (+12.3, +25.7)", "-"]
    written = set(rows.columns) - set(best.columns)
    assert written == {"head_name", "selection_text", "heldout_text", "selected_text", "margin_text"}
    assert written <= set(page_roles.HELDOUT_TABLE)  # the table shows each


def test_roles_one_heads_measurements_are_its_row_of_the_metrics():
    metrics = pd.DataFrame(
        {"layer": [0, 0, 1], "head": [0, 1, 0], "sink_mass": [0.5, 0.123456, 0.9], "kind": ["a", "b", "c"]}
    )
    shown = page_roles.head_measurements(metrics, 0, 1)
    assert list(shown["column"]) == ["sink_mass", "kind"] and list(shown["value"]) == ["0.1235", "b"]
    assert shown["measurement"].iloc[0] == METRIC_DESCRIPTIONS["sink_mass"]
    assert page_roles.measurements(metrics.assign(num_queries=[3, 3, 3])) == ["sink_mass"]


# ---- Circuits -----------------------------------------------------------------------------------------------
def test_circuits_prompts_are_the_tasks_or_the_visitors_own():
    ioi = TASKS_BY_NAME["ioi"]
    assert CircuitsSettings(task="ioi", clean="x").prompts() == (ioi.clean, ioi.corrupted, ioi.answer, ioi.foil)
    own = CircuitsSettings(task=page_circuits.CUSTOM, clean="A b", corrupted="A c", answer=" d", foil=" e")
    assert own.prompts() == ("A b", "A c", " d", " e")


def test_circuits_heads_settings_read_a_link_and_refuse_bad_values():
    """The weight circuits' and path patching's settings (tests/pages/test_page_heads_circuits.py opens such links
    on a tiny GPT-2; the link tests' SmolLM2 would compute every head's circuits on opening)."""
    query = {
        "qkov": "1",
        "cmode": "q",
        "cmin": "4.5",
        "qklayer": "2",
        "qkhead": "3",
        "qktokens": "a b c",
        "paths": "1",
        "recv": "1-1, 2-0",
        "via": "v",
    }
    chosen, notices = CircuitsSettings.from_address(query)
    assert notices == []
    assert (chosen.weights, chosen.composition, chosen.threshold, chosen.circuit_layer, chosen.circuit_head) == (
        True,
        "q",
        4.5,
        2,
        3,
    )
    assert (chosen.circuit_tokens, chosen.paths, chosen.receivers, chosen.via) == ("a b c", True, "1-1, 2-0", "v")
    assert chosen.to_address() == query
    assert CircuitsSettings.from_address({"cmin": "9"})[0].threshold == 6.0  # brought into 1 to 6, as the slider
    chosen, notices = CircuitsSettings.from_address({"cmode": "x", "cmin": "many", "qklayer": "-1", "via": "z"})
    assert (chosen.composition, chosen.threshold, chosen.circuit_layer, chosen.via) == ("k", 3.0, 0, "k")
    assert [notice.split(" is not ")[0] for notice in notices] == [
        "The link's cmode=x",
        "The link's cmin=many",
        "The link's qklayer=-1",
        "The link's via=z",
    ]


def test_circuits_lens_view_keeps_the_last_positions_top_tokens():
    positions = page_circuits.LENS_POSITIONS + 3
    rows = [
        {"layer": layer, "position": p, "rank": rank, "shown": f"t{layer}.{p}.{rank}", "probability": 0.1 * rank}
        for layer in range(2)
        for p in range(positions)
        for rank in range(2)
    ]
    table = pd.DataFrame(rows)
    table.attrs["tokens"] = [f"w{p}" for p in range(positions)]
    lens = page_circuits.lens_view(table)
    assert lens.cut and lens.labels == [f"{p}:w{p}" for p in range(3, positions)]
    grid = lens.grid("shown")
    assert grid.shape == (2, page_circuits.LENS_POSITIONS)
    assert grid[1, 0] == "t1.3.0" and grid[0, -1] == f"t0.{positions - 1}.0"
    short = page_circuits.lens_view(table[table["position"] < 4].copy().__finalize__(table))
    assert not short.cut and short.labels == ["0:w0", "1:w1", "2:w2", "3:w3"]


# ---- Lab ------------------------------------------------------------------------------------------------------
def test_lab_config_is_the_size_and_task_chosen():
    config = page_lab.lab_config(LabSettings(task="positional", size="2x2", seed=5, offset=4, positions="sinusoidal"))
    assert (config.task, config.num_layers, config.num_heads, config.d_model, config.vocab_size) == (
        "positional",
        2,
        2,
        32,
        32,
    )
    assert (config.seed, config.offset, config.positions) == (5, 4, "sinusoidal")
    assert page_lab.lab_config(LabSettings(size="2x4-mlp")).mlp


# ---- Compare --------------------------------------------------------------------------------------------------
def test_compare_offers_another_model_than_the_sidebars_default_first():
    offered = {"minilm": "a", "smollm2": "b", "mpnet": "c"}
    assert page_compare.second_model_default("minilm", offered) == "smollm2"
    assert page_compare.second_model_default("mpnet", offered) == "minilm"
    assert page_compare.second_model_default("minilm", {"minilm": "a"}) == "minilm"


# ---- Positions ------------------------------------------------------------------------------------------------
def test_positions_default_dimensions_are_the_first_pair_a_quarter_half_and_the_last_pair():
    assert page_positions.default_channels(64) == [0, 1, 16, 32, 62]
    assert page_positions.default_channels(8) == [0, 1, 2, 4, 6]
    assert page_positions.default_channels(4) == [0, 1, 2]


# ---- Explore --------------------------------------------------------------------------------------------------
def test_explore_focus_names_every_token_by_position():
    assert focus_choices(["[CLS]", "a", "cat"]) == {ALL_TOKENS: "all tokens", 0: "0: [CLS]", 1: "1: a", 2: "2: cat"}


def test_explore_encoder_decoder_settings_read_a_link_and_refuse_bad_values():
    """An encoder-decoder model's source, target, writing switch and attention (tests/page_links.py has no link
    with an encoder-decoder model: its checkpoints are built by the tests)."""
    query = {"source": "Hallo Welt.", "target": "Hello world.", "write": "0", "kind": "decoder"}
    chosen, notices = ExploreSettings.from_address(query)
    assert notices == []
    assert (chosen.source, chosen.target, chosen.write, chosen.kind) == (
        "Hallo Welt.",
        "Hello world.",
        False,
        "decoder",
    )
    assert chosen.to_address() == query
    chosen, notices = ExploreSettings.from_address({"kind": "self", "write": "yes", "temp": "0.3", "ndepth": "101"})
    assert (chosen.kind, chosen.write, chosen.temperature, chosen.needle_depth) == ("cross", None, 1.0, 50)
    assert [notice.split(" is not ")[0] for notice in notices] == [
        "The link's temp=0.3",
        "The link's ndepth=101",
        "The link's write=yes",
        "The link's kind=self",
    ]
    long = "x" * (address.MAX_TEXT_CHARS + 5)
    assert ExploreSettings.from_address({"source": long})[0].source == long[: address.MAX_TEXT_CHARS]


# ---- Classroom ------------------------------------------------------------------------------------------------
def test_classroom_reveals_steps_and_question_names():
    digest = page_classroom.question_digest("Which token?", "sat")
    assert digest == hashlib.sha1(b"Which token?\nsat").hexdigest()[:12]
    assert page_classroom.reveal_key(digest) == f"cls_reveal_{digest}"
    assert page_classroom.revealed_in(None) == set()
    assert page_classroom.revealed_in(f"{digest},{'0' * 12}") == {digest, "0" * 12}
    for bad in ("xyz", digest + ",", digest.upper(), ",".join([digest] * 17)):
        with pytest.raises(ValueError, match="a list of revealed answers"):
            page_classroom.revealed_in(bad)
    assert [page_classroom.moved(step, by) for step, by in ((1, -1), (1, 1), (10, 1), (5, -1))] == [1, 2, 10, 4]
    assert ClassroomSettings.declared("step").maximum == page_classroom.STEP_COUNT


# ---- every page ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link", [item for item in LINKS if item.page in PAGES], ids=lambda item: item.name)
def test_each_page_declaration_reads_its_links_settings_and_writes_the_same_link(link):
    page, given = PAGES[link.page]
    declared = {d.url_key: (name, d) for name, d in page.declarations().items()}
    ours = [s for s in link.settings if s.url_key in declared]
    assert ours  # the page's own settings (the sidebar's and the shared layer and head are not declared here)
    chosen, notices = page.from_address(link.link_query, **given)
    assert notices == []
    for setting in ours:
        name, declaration = declared[setting.url_key]
        assert getattr(chosen, name) == setting.value, name
        if "{" not in declaration.key:  # a key that names the mode or task ("{view}_difference") is one per view
            assert declaration.key == setting.key, name
        if declaration.default is not None:  # None: the default follows the model
            assert getattr(page(), name) == setting.default, name  # with MiniLM, where it follows the model
        if setting.label is not None and declaration.key not in SHARED_INDEX_KEYS:
            shown = i18n.translate(declaration.label, link.link_query.get("lang", "en"))  # a link in Chinese
            assert shown.format(model="minilm") == setting.label, name
    assert chosen.to_address() == {s.url_key: s.link for s in ours}


def test_every_declared_setting_has_its_own_keys_and_a_default_in_range():
    for page, _ in PAGES.values():
        declared = page.declarations()
        assert {f.name for f in dataclasses.fields(page)} == set(declared)
        assert len({d.key for d in declared.values()}) == len({d.url_key for d in declared.values()}) == len(declared)
        for name, setting in declared.items():
            default = page().__getattribute__(name)
            assert default == setting.default
            if setting.kind == "number" and default is not None:  # None: the default follows the model
                low = setting.minimum if setting.minimum is not None else -(10**9)
                high = setting.maximum if setting.maximum is not None else 10**9
                assert low <= default <= high, name
            if setting.kind == "choice" and setting.options is not None:
                assert default in setting.options, name
