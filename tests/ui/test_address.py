"""ui/address.py: every value a link gives a setting is parsed one way; anything else is refused."""

from __future__ import annotations

import pytest

from ui import address

# Text that Python's own checks take for a number, or that looks like one: str.isdigit() accepts the
# superscripts and other scripts' digits, int() accepts those digits, "_", "+", and spaces around.
NOT_WHOLE_NUMBERS = [
    "²",  # superscript two: isdigit() True, int() fails
    "³3",
    "٣",  # Arabic-Indic three: int() gives 3
    "३",  # Devanagari three
    "３",  # fullwidth three
    "𝟑",  # mathematical bold three
    "1_000",
    "+3",
    " 3",
    "3 ",
    "3\n",
    "--3",
    "-",
    "",
    "3.0",
    "3.5",
    "1e3",
    "0x10",
    "inf",
    "nan",
    "3a",
    "1" * 10,  # ten digits: longer than any setting
    "9" * 400,  # a huge number (int() would take it, and allocate for it)
]


@pytest.mark.parametrize("raw", NOT_WHOLE_NUMBERS, ids=ascii)
def test_only_ascii_digits_are_whole_numbers(raw):
    with pytest.raises(ValueError, match=r"^a whole number from 0 to 999999999$"):
        address.whole_number(raw)


def test_whole_numbers_in_their_range():
    assert address.whole_number("0") == 0
    assert address.whole_number("007") == 7
    assert address.whole_number("999999999") == 999_999_999
    assert address.whole_number("-3", -5, 5) == -3
    assert address.whole_number("-0", -5, 5) == 0
    for raw in ("-6", "6", "-3"):
        with pytest.raises(ValueError, match=r"^a whole number from (-5|0) to 5$"):
            address.whole_number(raw, 0 if raw == "-3" else -5, 5)
    parse = address.number(2, 12)
    assert [parse(raw) for raw in ("2", "12")] == [2, 12]
    with pytest.raises(ValueError, match="from 2 to 12"):
        parse("13")


def test_a_choice_is_one_of_the_options_as_written():
    parse = address.choice([4, 8, 16])
    assert parse("8") == 8 and isinstance(parse("8"), int)
    for raw in ("08", "8.0", "²", "", "3"):
        with pytest.raises(ValueError, match=r"^one of 4, 8, 16$"):
            parse(raw)
    names = address.choice({"dot": "dot product", "cosine": "cosine"})  # a dict's keys, not its labels
    assert names("dot") == "dot"
    with pytest.raises(ValueError):
        names("dot product")
    many = address.choice(range(20))
    with pytest.raises(ValueError, match=r"^one of 0, 1, 2, 3, 4, 5, 6, 7, \.\.\.$"):
        many("20")


def test_several_choices_round_trip_and_are_checked():
    options = ["L0H0", "L0H1", "L1H0"]
    parse = address.choices(options)
    for values in ([], ["L1H0"], ["L1H0", "L0H0"], options):
        assert parse(address.format_choices(values)) == values
    assert address.format_choices([]) == address.NONE  # an empty value would drop the setting from the link
    numbers = address.choices(range(8))
    assert numbers(address.format_choices([7, 0, 3])) == [7, 0, 3]
    for raw in ("", "L0H0,", "L0H0,L0H0", "L2H0", "L0H0;L0H1", ",".join(options + options)):
        with pytest.raises(ValueError):
            parse(raw)


def test_flags_are_1_or_0():
    assert address.flag("1") is True and address.flag("0") is False
    assert address.format_flag(True) == "1" and address.format_flag(False) == "0"
    for raw in ("true", "on", "yes", "", "01", "¹"):
        with pytest.raises(ValueError, match=r"^1 \(on\) or 0 \(off\)$"):
            address.flag(raw)


def test_a_list_of_heads_keeps_the_models_heads_and_names_the_refused_ones():
    from mha_core.models.ablation import AblationError, parse_heads, split_heads

    assert split_heads("L99H99,L0H0,zzz 3.2; l1h1 3.2", num_layers=6, num_heads=12) == (
        [(0, 0), (3, 2), (1, 1)],
        ["L99H99", "zzz"],
    )
    assert split_heads("L99H99, 0:5") == ([(99, 99), (0, 5)], [])  # without the model's sizes: the names only
    with pytest.raises(AblationError, match=r"^'L6H0', 'x' name no head \(this model has layers 0 to 5 and heads"):
        parse_heads("L6H0 L0H0 x", num_layers=6, num_heads=12)
    parse = address.head_names(6, 12)
    assert parse("L0H1,3.2") == ["L0H1", "L3H2"] and parse(address.NONE) == []
    with pytest.raises(address.PartlyRefused) as refused:
        parse("L99H99,L0H0,zzz")
    assert refused.value.kept == ["L0H0"] and "'L99H99', 'zzz' name no head" in str(refused.value)
    with pytest.raises(address.PartlyRefused) as refused:
        parse("L0H1,L0H1")
    assert refused.value.kept == ["L0H1"] and "more than once" in str(refused.value)
    with pytest.raises(address.PartlyRefused) as refused:
        parse("1" * 40)  # a name of no head, however long: refused by name, nothing kept
    assert refused.value.kept == []


def test_a_layer_or_head_number_names_the_models_range():
    assert address.index_number("5", 6, "layer") == 5
    assert address.index_number("99", 6, "layer") == 99  # past the last: the page clamps it, with a notice
    for raw in ("1e9", "²", "-1x", "9" * 12):
        with pytest.raises(ValueError, match=r"^a head number from 0 to 11$"):
            address.index_number(raw, 12, "head")
