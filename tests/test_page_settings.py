"""Settings declared once per page (ui/page_settings.py) and each page's logic without AppTest: the declarations
read every link tests/page_links.py writes, refuse bad values with the notices the pages show, and write the
same link back; the pages' logic functions return the numbers an independent computation gives."""

from __future__ import annotations

import dataclasses

import pytest

from tests.page_links import LINKS
from ui import address
from ui.page_settings import Declared, PageSettings
from ui.widgets.pickers import SHARED_INDEX_KEYS

# Each page's settings, and the parsers of the settings whose range follows the model (MiniLM and the default
# sentence, as tests/page_links.py's links are opened with; SmolLM2 for Circuits).
PAGES: dict = {}


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
            assert declaration.label.format(model="minilm") == setting.label, name
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
