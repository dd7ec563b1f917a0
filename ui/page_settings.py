"""Settings declared once per page: each page's settings are one frozen dataclass whose fields say, each once,
the setting's type and default, its range or choices, its address key, its widget's session key, label and help
text (``setting``). Reading the address (``from_address``, plain Python), writing it back (``to_address``),
checking bad values (``ui.address``'s parsers, with the messages they give), the widgets' starting values and
drawing the widgets (``Declared``: through ``ui.widgets.pickers``) all come from the declaration, and a page's
logic takes the frozen values (``from_session``).

Every user-visible word of a setting (label, help, the names of its choices) is in its declaration, so the
interface's words are gathered in one place per page.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import streamlit as st

from ui import address
from ui.i18n import t
from ui.widgets import pickers

_DECLARED = "headscope_setting"  # the dataclass field's metadata key of its declaration


@dataclass(frozen=True)
class Declared:
    """One setting of a page: its widget's session ``key``, its address key ``url_key``, ``default``, the bounds
    of a number (``minimum``, ``maximum``) or the ``options`` of a choice (value -> the words shown), and the
    widget's ``label`` and ``help``. ``kind`` is how the address writes it: "choice", "choices", "heads",
    "layer", "head", "number", "decimal" (a decimal number brought into its bounds), "flag",
    "text" or "sentence" (a short text with something visible in it, ``address.sentence``). A bound or an option list that follows the model is given
    where the widget is drawn (``None`` here); the declaration's are used otherwise."""

    key: str
    url_key: str
    kind: str
    default: Any = None
    label: str = ""
    help: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    options: dict | None = None

    @property
    def parsed_alone(self) -> bool:
        """Whether the declaration alone can check a link's value: heads and layers follow the model, and so do
        the options of a choice and the lower bound of a number declared without them."""
        if self.kind == "number":
            return self.minimum is not None
        return self.kind not in ("heads", "layer", "head") and not (
            self.kind in ("choice", "choices") and self.options is None
        )

    def parser(self, options=None, minimum: int | None = None, maximum: int | None = None):
        """The ``ui.address`` parser of this setting's link text (``options`` and bounds: the drawn widget's)."""
        options = self.options if options is None else options
        if self.kind == "choice":
            return address.choice(options)
        if self.kind == "choices":
            return address.choices(options)
        if self.kind == "number":
            low = self.minimum if minimum is None else minimum
            high = self.maximum if maximum is None else maximum
            return address.number(low, address.LARGEST if high is None else high)
        if self.kind == "flag":
            return address.flag
        if self.kind == "decimal":
            low = self.minimum if minimum is None else minimum
            high = self.maximum if maximum is None else maximum
            return lambda raw: min(max(float(raw), low), high)
        if self.kind == "text":
            return lambda raw: raw[: address.MAX_TEXT_CHARS]
        if self.kind == "sentence":
            return address.sentence()
        raise ValueError(f"a setting of kind {self.kind!r} is parsed where it is drawn")

    def format(self, value) -> str:
        """The setting's value as its link writes it."""
        if self.kind in ("choices", "heads"):
            return address.format_choices(value)
        if self.kind == "flag":
            return address.format_flag(value)
        return str(value)

    # ---- drawn through ui.widgets.pickers (the session's value, else the link's, else the default) ----
    def _help(self, kwargs: dict) -> dict:
        return {"help": t(self.help), **kwargs} if self.help is not None else kwargs

    # The words shown (label, help, choices) in the session's language (``ui.i18n``: English where the catalog has
    # no entry); the values, the session keys and the address stay as declared.
    @property
    def shown_label(self) -> str:
        return t(self.label)

    def shown_options(self) -> dict:
        """The choices' words, value -> words (a dict made at draw time: its ``get`` is the widget's format)."""
        return {value: t(words) for value, words in self.options.items()}

    def select(self, draw, options=None, *, default=None, **kwargs):
        """A selectbox, radio or select slider over ``options`` (default: the declaration's, shown by their words)."""
        if options is None:
            options = self.options
            kwargs.setdefault("format_func", self.shown_options().get)
        return pickers.url_select(
            draw,
            self.shown_label,
            options,
            key=self.key,
            url_key=self.url_key,
            default=self.default if default is None else default,
            **self._help(kwargs),
        )

    def number(self, draw, *, minimum: int | None = None, maximum: int | None = None, default=None, **kwargs) -> int:
        """A number input or slider from the declaration's bounds (or those given: they follow the model)."""
        return pickers.url_number(
            draw,
            self.shown_label,
            self.minimum if minimum is None else minimum,
            self.maximum if maximum is None else maximum,
            key=self.key,
            url_key=self.url_key,
            default=self.default if default is None else default,
            **self._help(kwargs),
        )

    def multiselect(self, options, *, container=None, default=None, **kwargs) -> list:
        """A multiselect over ``options``; ``default``: the declaration's unless given (it follows the model)."""
        return pickers.url_multiselect(
            self.shown_label,
            options,
            key=self.key,
            url_key=self.url_key,
            default=list((self.default if default is None else default) or []),
            container=container,
            **self._help(kwargs),
        )

    def widget(self, draw, *args, default=None, fit=None, **kwargs):
        """Any other widget ``draw`` (``st.text_input``, ...) over the declaration's parser and link text
        (``pickers.url_widget``); ``default``: the declaration's unless given (it follows the model)."""
        return pickers.url_widget(
            draw,
            self.shown_label,
            *args,
            key=self.key,
            url_key=self.url_key,
            default=self.default if default is None else default,
            parse=self.parser(),
            format=self.format,
            fit=fit,
            **self._help(kwargs),
        )

    def toggle(self, *, container=None, **kwargs) -> bool:
        return pickers.url_toggle(
            self.shown_label, self.key, self.url_key, bool(self.default), container=container, **self._help(kwargs)
        )

    def layer(self, num_layers: int, *, label: str | None = None, container=None, default: int = 0) -> int:
        """A layer slider of its own (``pickers.select_layer``); ``label``: words that name the model."""
        return pickers.select_layer(
            num_layers,
            label=self.shown_label if label is None else label,
            key=self.key,
            url_key=self.url_key,
            container=container,
            default=default,
        )

    def head(self, num_heads: int, *, container=None) -> int:
        """A head selector of its own (``pickers.select_head``)."""
        return pickers.select_head(
            num_heads, label=self.shown_label, key=self.key, url_key=self.url_key, container=container
        )

    def text(self, *, container=None, what: str | None = None, default: str | None = None, **kwargs) -> str:
        """A text box cut to ``address.MAX_TEXT_CHARS`` with a notice naming it by its label (or ``what``: the
        words that name it when its label is a long sentence); ``default``: the declaration's unless given."""
        return pickers.url_text(
            self.shown_label,
            key=self.key,
            url_key=self.url_key,
            default=self.default if default is None else default,
            what=self.shown_label.lower() if what is None else what,
            container=container,
            **self._help(kwargs),
        )

    def segmented(self, *, container=None, **kwargs) -> str:
        return pickers.url_choice(
            self.shown_label,
            self.shown_options(),
            key=self.key,
            url_key=self.url_key,
            container=container,
            **self._help(kwargs),
        )

    def start(self, parse=None, default=None) -> Any:
        """The setting's starting value without a widget yet (``pickers.url_setting``): a view drawn before its
        control, or a setting drawn by a component."""
        parse = self.parser() if parse is None else parse
        pickers.url_setting(self.key, self.url_key, self.default if default is None else default, parse)
        return st.session_state[self.key]

    def keyed(self, **names) -> Declared:
        """The same setting under a session key that names something (``key`` written as "lab_layer_{task}")."""
        return dataclasses.replace(self, key=self.key.format(**names))

    def set(self, value) -> None:
        """Set the widget's value from code (a click on a chart, a component's pick): it shows on the next run."""
        st.session_state[self.key] = value

    def keep(self, default=None) -> None:
        """Remember the value for the session and write it to the address (``pickers.keep_in_url``)."""
        pickers.keep_in_url(self.key, self.url_key, self.default if default is None else default, self.format)


def setting(
    key: str,
    url_key: str,
    kind: str,
    default: Any = None,
    *,
    label: str = "",
    help: str | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    options: dict | None = None,
):
    """A field of a page's settings dataclass and its declaration (``Declared``)."""
    declared = Declared(
        key, url_key, kind, default, label=label, help=help, minimum=minimum, maximum=maximum, options=options
    )
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={_DECLARED: declared})
    return dataclasses.field(default=default, metadata={_DECLARED: declared})


class PageSettings:
    """The base of a page's settings dataclass (``@dataclass(frozen=True)``, its fields made by ``setting``)."""

    @classmethod
    def declarations(cls) -> dict[str, Declared]:
        """Each field's declaration, by field name, in the declaration's order."""
        return {item.name: item.metadata[_DECLARED] for item in dataclasses.fields(cls) if _DECLARED in item.metadata}

    @classmethod
    def declared(cls, name: str) -> Declared:
        return cls.declarations()[name]

    @classmethod
    def from_address(cls, query: dict[str, str], /, **given) -> tuple[PageSettings, list[str]]:
        """The settings a link gives (plain Python): each value its declaration's parser takes, else the
        default, with a notice per refused value (the words ``ui.widgets.pickers`` shows). ``given``: the parsers of
        settings whose range follows the model, by field name (a setting not ``parsed_alone`` is read only with one)."""
        values, notices = {}, []
        for name, declared in cls.declarations().items():
            raw = query.get(declared.url_key)
            parse = given.get(name) or (declared.parser() if declared.parsed_alone else None)
            if raw is None or parse is None:
                continue
            try:
                values[name] = parse(raw)
            except address.PartlyRefused as error:
                values[name] = error.kept
                kept = address.format_choices(error.kept)
                notices.append(f"The link's {declared.url_key}={raw[:60]}: {error}; kept {kept}.")
            except ValueError as error:
                notices.append(f"The link's {declared.url_key}={raw[:40]} is not {error}; using the default.")
        return cls(**values), notices

    def to_address(self) -> dict[str, str]:
        """The link's text of every setting that is not at its default (as the page writes it back)."""
        query = {}
        for name, declared in self.declarations().items():
            value = getattr(self, name)
            if value != declared.default:
                query[declared.url_key] = declared.format(value)
        return query

    @classmethod
    def from_session(cls, **given) -> PageSettings:
        """The values the page's widgets hold now (those not drawn yet: their defaults), as one frozen value;
        ``given`` overrides (a setting drawn with a default that follows the model)."""
        values = {}
        for name, declared in cls.declarations().items():
            if declared.key in st.session_state:
                values[name] = st.session_state[declared.key]
        return cls(**{**values, **given})
