"""Attention as heatmaps and lines: one head, all heads of a layer, all layers x heads at once.

Payload: heatmap values travel as float32 typed arrays (base64 ``{"dtype": "f4", "bdata": ...}``),
so the layer x head grid at 128 tokens costs 4 bytes a cell, with the exact weight in the hover.
"""

from __future__ import annotations

import html
import itertools
import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import (
    ATTENTION_COLORSCALE,
    COLORBAR_ABOVE_ROOM,
    COLORBAR_MARGIN,
    DIFFERENCE_COLORSCALE,
    DIFFERENCE_SCALE,
    MASKED_COLOR,
    SEGMENT_COLOR,
    TOKEN_TICK_LIMIT,
    base_layout_dict,
    colorbar_above,
    colorbar_at_right,
    plotly_text,
)


def _figure(data: list[dict], layout: dict) -> go.Figure:
    """The whole figure in one constructor, unvalidated: Plotly's per-property validation cost 20-30 ms a
    figure (more than the rest of a rerun), and these builders only use properties the tests check are
    valid (``tests/ui/figures/test_figures_fast.py`` rebuilds each figure with validation)."""
    return go.Figure(data=data, layout=layout, _validate=False)


def tile_gap(n: int) -> int:
    """Blank cells between two tiles: about a tenth of a tile, at least one."""
    return max(1, min(n // 10, -(-n // 25)))


@dataclass(frozen=True)
class TileGrid:
    """Where the tiles of an R x C grid of ``[n, m]`` tiles sit in one canvas, with blank gaps between them."""

    rows: int
    cols: int
    n: int
    m: int
    gap_y: int
    gap_x: int

    @property
    def step_y(self) -> int:
        return self.n + self.gap_y

    @property
    def step_x(self) -> int:
        return self.m + self.gap_x

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows * self.step_y - self.gap_y, self.cols * self.step_x - self.gap_x

    def places(self):
        """(row, col, canvas rows, canvas columns) of every tile."""
        for r in range(self.rows):
            for c in range(self.cols):
                yield (
                    r,
                    c,
                    slice(r * self.step_y, r * self.step_y + self.n),
                    slice(c * self.step_x, c * self.step_x + self.m),
                )

    def canvas(self, per_tile: np.ndarray, fill, dtype) -> np.ndarray:
        """One array of the canvas's shape: ``per_tile[r, c]`` (a tile, or one value) in each tile's place."""
        full = np.full(self.shape, fill, dtype=dtype)
        for r, c, ys, xs in self.places():
            full[ys, xs] = per_tile[r, c]
        return full

    def categories(self, tokens: list[str], labels: list[str], axis: str) -> list[str]:
        """Unique axis categories such as ``"head 3 · key 5 cat"``, with unique blank ones in the gaps,
        so the hover names the tile and the token without a label per cell."""
        count, gap, word, blank = (
            (self.m, self.gap_x, "key", " ") if axis == "x" else (self.n, self.gap_y, "query", "\u2009")
        )
        names = [plotly_text(t) for t in tokens]
        categories = []
        for index, label in enumerate(labels):
            # Zero-width spaces keep categories unique when tiles share a label (or have none).
            prefix = (f"{plotly_text(label)} · " if label else "") + "\u200b" * index
            categories += [f"{prefix}{word} {j} {names[j]}" for j in range(count)]
            if index < len(labels) - 1:
                categories += [blank * (index * gap + g + 1) for g in range(gap)]
        return categories


def _mask_and_pair_shapes(grid: TileGrid, tiles: np.ndarray, causal: bool, segment_ids) -> list[dict]:
    """All tiles' causal masks in ONE path shape and all sentence-pair boundaries in another: hundreds of
    separate shapes (SmolLM2 has 270 heads) cost the browser more than the heatmap itself."""
    shapes = []
    if causal:
        boxes = [
            f"M{xs.start - 0.5},{ys.start - 0.5}H{xs.stop - 0.5}V{ys.stop - 0.5}H{xs.start - 0.5}Z"
            for r, c, ys, xs in grid.places()
            if not np.isnan(tiles[r, c]).all()
        ]  # empty places: no ground
        shapes.append(dict(type="path", path="".join(boxes), layer="below", line=dict(width=0), fillcolor=MASKED_COLOR))
    if segment_ids is not None and len(segment_ids) == grid.n and np.any(np.asarray(segment_ids) != segment_ids[0]):
        boundary = int(np.argmax(np.asarray(segment_ids) != segment_ids[0]))
        lines = [
            f"M{xs.start - 0.5 + boundary},{ys.start - 0.5}V{ys.stop - 0.5}"
            f"M{xs.start - 0.5},{ys.start - 0.5 + boundary}H{xs.stop - 0.5}"
            for _, _, ys, xs in grid.places()
        ]
        shapes.append(dict(type="path", path="".join(lines), line=dict(color=SEGMENT_COLOR, width=1.5, dash="dot")))
    return shapes


def strongest_link(tile: np.ndarray, y_tokens: list[str], x_tokens: list[str]) -> str:
    """ "it → cat 0.62": the largest weight a tile shows, with its query and key (what to look at first)."""
    if np.isnan(tile).all():
        return ""
    i, j = np.unravel_index(np.nanargmax(tile), tile.shape)
    return f"{plotly_text(y_tokens[i])} → {plotly_text(x_tokens[j])} {tile[i, j]:.2f}"


def _tile_targets(grid: TileGrid, x_cats, y_cats, targets: np.ndarray, hover: str, notes: list[str]) -> dict:
    """One invisible, selectable marker at the centre of every tile whose ids are not -1; ``notes``
    (one per tile, row by row) go into its hover as ``%{text}``."""
    places = [(r, c) for r in range(grid.rows) for c in range(grid.cols) if targets[r, c, 0] >= 0]
    return dict(
        type="scatter",
        x=[x_cats[c * grid.step_x + grid.m // 2] for _, c in places],
        y=[y_cats[r * grid.step_y + grid.n // 2] for r, _ in places],
        customdata=[targets[r, c].tolist() for r, c in places],
        text=[notes[r * grid.cols + c] for r, c in places],
        mode="markers",
        showlegend=False,
        marker=dict(size=8, symbol="square", color="rgba(0, 0, 0, 0)"),
        hovertemplate=hover + "<extra></extra>",
    )


def _tick_label_margins(xaxis: dict, yaxis: dict, titled: bool) -> dict:
    """Left and bottom margins that hold the token tick labels (x labels turned 60 degrees) and the axis
    titles, from the labels' lengths. Plotly's ``automargin`` measures them instead, at the price of a
    second layout pass: the one-head heatmap took 40-100 ms to draw with it and about 22 ms without."""

    def widest(axis: dict) -> float:
        size = axis["tickfont"]["size"]
        longest = max((len(html.unescape(t)) for t in axis["ticktext"]), default=0)
        return longest * size * 0.62 + 8  # an average glyph is ~0.6 em; 8 px of tick padding

    title_room = 24 if titled else 0
    x_width = widest(xaxis)
    bottom = x_width * math.sin(math.radians(60)) + title_room + 10
    # A turned label also reaches left of its tick: the first one must fit inside the left margin.
    left = max(widest(yaxis) + title_room + 4, x_width * math.cos(math.radians(60)))
    return {"l": math.ceil(left), "b": math.ceil(bottom)}


def _token_axes(grid: TileGrid, x_cats, y_cats, x_tokens, y_tokens, show: bool) -> tuple[dict, dict]:
    """Token names as tick labels under and beside every tile, or no tick labels at all."""
    if not show:
        return dict(showticklabels=False, ticks=""), dict(showticklabels=False, ticks="")
    x_names, y_names = [plotly_text(t) for t in x_tokens], [plotly_text(t) for t in y_tokens]
    xaxis = dict(
        tickmode="array",
        tickvals=[x_cats[c * grid.step_x + j] for c in range(grid.cols) for j in range(grid.m)],
        ticktext=x_names * grid.cols,
        tickangle=-60,
        tickfont=dict(size=9 if grid.cols > 1 else 11),
    )
    yaxis = dict(
        tickmode="array",
        tickvals=[y_cats[r * grid.step_y + i] for r in range(grid.rows) for i in range(grid.n)],
        ticktext=y_names * grid.rows,
        tickfont=dict(size=9 if grid.rows > 1 else 11),
    )
    return xaxis, yaxis


def _tile_label_annotations(grid: TileGrid, row_labels, col_labels, with_row_labels: bool) -> list[dict]:
    """Column labels above the grid; row labels left of it (when no token ticks take that place)."""
    annotations = []
    if any(col_labels):
        annotations += [
            dict(
                x=c * grid.step_x + (grid.m - 1) / 2,
                y=1.0,
                yref="paper",
                yanchor="bottom",
                xref="x",
                text=plotly_text(col_labels[c]),
                showarrow=False,
                font=dict(size=11),
            )
            for c in range(grid.cols)
        ]
    if any(row_labels) and with_row_labels:
        annotations += [
            dict(
                y=r * grid.step_y + (grid.n - 1) / 2,
                x=-0.5 - grid.gap_x,
                xref="x",
                xanchor="right",
                yref="y",
                text=plotly_text(row_labels[r]),
                showarrow=False,
                font=dict(size=11),
            )
            for r in range(grid.rows)
        ]
    return annotations


def tiled_heatmap(
    tiles: np.ndarray,
    row_labels: list[str],
    col_labels: list[str],
    x_tokens: list[str],
    y_tokens: list[str],
    *,
    causal: bool = False,
    segment_ids: np.ndarray | None = None,
    targets: np.ndarray | None = None,
    target_hover: str = "",
    show_token_ticks: bool | None = None,
    title: str | None = None,
    height: int | None = None,
    zmax: float = 1.0,
    difference: bool = False,
    gaps: tuple[int, int] | None = None,
    width_hint: int = 1000,
    annotations: list[dict] | None = None,
    axis_titles: tuple[str, str] | None = None,
    colorbar: bool = True,
    colorbar_on_top: bool = False,
) -> go.Figure:
    """Tiles ``[R, C, n, m]`` laid out in an R x C grid as ONE heatmap trace.

    Tiles are separated by rows and columns of NaN (drawn as background, not hoverable).
    ``targets`` (ints ``[R, C, k]``, -1 for an empty place) makes every tile clickable: one invisible
    marker at each tile's centre carries its ids as ``customdata`` and ``target_hover`` as its hover, and
    the nearest marker to the pointer always answers (``hoverdistance=-1``), so a click anywhere on a tile
    selects it (Plotly heatmap cells cannot be selected; markers can). The cells' own hover then gives way
    to the tile's.
    ``causal`` blanks the cells above the diagonal (query i never sees key j > i) on a grey ground.
    ``segment_ids`` (``[n]``, 0/1) draws the sentence-pair boundary inside every tile.
    Cells are square; ``width_hint`` (the chart's expected width in pixels) sets the height to match.
    ``annotations`` replace the row and column labels; ``axis_titles`` are (x, y) axis titles.
    ``colorbar=False`` leaves out the colour bar (drawing one is a small chart of its own: ticks, title,
    text measured), for a grid shown next to a chart whose colour bar it shares; ``colorbar_on_top`` draws it
    above the plot from its left edge, next to a map narrower than its chart (one square tile), instead of at the
    chart's right edge.
    """
    tiles = np.asarray(tiles, dtype=np.float32)
    if tiles.ndim != 4:
        raise ValueError(f"tiles must be [rows, cols, n, m], got shape {tiles.shape}")
    num_rows, num_cols, n, m = tiles.shape
    grid = TileGrid(num_rows, num_cols, n, m, *(gaps or (tile_gap(n), tile_gap(m))))
    values = tiles
    if causal:
        values = tiles.copy()
        values[..., np.triu(np.ones((n, m), dtype=bool), k=1 + m - n)] = np.nan
    full = grid.canvas(values, np.nan, np.float32)
    x_cats = grid.categories(x_tokens, col_labels, "x")
    y_cats = grid.categories(y_tokens, row_labels, "y")

    heatmap = dict(
        type="heatmap",
        z=full,
        x=x_cats,
        y=y_cats,
        # A difference of two weights runs from -1 to 1: red where the left side attends more.
        colorscale=DIFFERENCE_COLORSCALE if difference else ATTENTION_COLORSCALE,
        zmin=-zmax if difference else 0.0,
        zmax=zmax,
        hoverongaps=False,
        hovertemplate="%{y}<br>%{x}<br>" + ("difference" if difference else "weight") + " %{z:.4f}<extra></extra>",
        xgap=0,
        ygap=0,
        # More cells than pixels (the model view at 128 tokens): let the browser scale one image
        # (measured 15% faster); fewer, larger cells stay crisp (no interpolation).
        zsmooth="fast" if full.shape[1] > width_hint - 150 else False,
        colorbar=(colorbar_above if colorbar_on_top else colorbar_at_right)("left − right" if difference else "weight"),
        showscale=colorbar,
    )
    data, layout = [heatmap], {}
    if targets is not None:
        notes = [strongest_link(values[r, c], y_tokens, x_tokens) for r in range(num_rows) for c in range(num_cols)]
        heatmap["hoverinfo"] = "skip"
        data.append(
            _tile_targets(
                grid=grid, x_cats=x_cats, y_cats=y_cats, targets=np.asarray(targets), hover=target_hover, notes=notes
            )
        )
        layout.update(hoverdistance=-1, clickmode="event+select")

    if show_token_ticks is None:
        show_token_ticks = max(n, m) <= TOKEN_TICK_LIMIT and num_cols * m <= 4 * TOKEN_TICK_LIMIT
    xaxis, yaxis = _token_axes(
        grid=grid, x_cats=x_cats, y_cats=y_cats, x_tokens=x_tokens, y_tokens=y_tokens, show=show_token_ticks
    )
    if height is None:
        # Plot area = chart width less the token labels and the colour bar (about 150 px).
        height = int(min(1600, max(260, 100 + (width_hint - 150) * full.shape[0] / full.shape[1])))
    layout.update(base_layout_dict(height, title))
    row_labels_shown = any(row_labels) and not show_token_ticks
    layout["margin"].update(l=70 if row_labels_shown else 10, t=60 if title else 30)
    if colorbar and colorbar_on_top:
        layout["margin"].update(t=layout["margin"]["t"] + COLORBAR_ABOVE_ROOM, autoexpand=False)
    else:
        layout["margin"].update(COLORBAR_MARGIN if colorbar else {"autoexpand": False})
    if show_token_ticks:
        layout["margin"].update(_tick_label_margins(xaxis, yaxis, axis_titles is not None))
    # Square cells; the spare width or height goes to the right or the bottom, so the token labels
    # stay next to the tiles.
    layout.update(
        xaxis=dict(
            type="category",
            showgrid=False,
            zeroline=False,
            side="bottom",
            # Margins sized to the tick labels cost Plotly a second layout pass: only where there are labels.
            automargin=False,
            constrain="domain",
            constraintoward="left",
            **xaxis,
            **({"title": {"text": axis_titles[0]}} if axis_titles else {}),
        ),
        yaxis=dict(
            type="category",
            showgrid=False,
            zeroline=False,
            autorange="reversed",
            automargin=False,
            scaleanchor="x",
            scaleratio=1,
            constrain="domain",
            constraintoward="top",
            **yaxis,
            **({"title": {"text": axis_titles[1]}} if axis_titles else {}),
        ),
    )
    shapes = _mask_and_pair_shapes(grid, tiles, causal, segment_ids)
    if annotations is None:
        annotations = _tile_label_annotations(grid, row_labels, col_labels, row_labels_shown)
    layout.update({key: value for key, value in (("shapes", shapes), ("annotations", annotations)) if value})
    return _figure(data, layout)


def head_heatmap(
    matrix: np.ndarray,
    x_tokens: list[str],
    y_tokens: list[str],
    *,
    causal: bool = False,
    segment_ids: np.ndarray | None = None,
    title: str | None = None,
    height: int | None = None,
    difference: bool = False,
) -> go.Figure:
    """One head's ``[n, m]`` attention as a large heatmap (rows = queries, columns = keys); ``difference``:
    a difference of two such matrices, on the fixed scale ±``DIFFERENCE_SCALE``."""
    matrix = np.asarray(matrix, dtype=np.float32)
    n = matrix.shape[0]
    return tiled_heatmap(
        matrix[None, None],
        [""],
        [""],
        x_tokens,
        y_tokens,
        causal=causal,
        segment_ids=segment_ids,
        show_token_ticks=n <= 2 * TOKEN_TICK_LIMIT,
        title=title,
        height=height or int(min(900, max(380, 140 + n * 16))),
        axis_titles=("key (attended to)", "query (attending)"),
        difference=difference,
        zmax=DIFFERENCE_SCALE if difference else 1.0,
        colorbar_on_top=True,  # one square map: its colour bar right above it
    )


def head_grid(
    attentions_of_layer: np.ndarray,
    tokens: list[str],
    *,
    columns: int = 4,
    width_hint: int = 1000,
    key_tokens: list[str] | None = None,
    **kwargs,
) -> go.Figure:
    """All heads of one layer ``[H, n, n]`` as small heatmaps in ONE trace, ``columns`` heads a row;
    a click on a head selects it (its number is the clicked point's ``customdata[0]``). Token names
    label the tiles when a cell is wide enough to read them (about 11 px). ``key_tokens``: the columns are another
    text's tokens (cross-attention, ``[H, n, m]``), each tile n cells high and m wide."""
    attentions_of_layer = np.asarray(attentions_of_layer, dtype=np.float32)
    num_heads, n, m = attentions_of_layer.shape
    key_tokens = tokens if key_tokens is None else key_tokens
    # A column count that divides the heads leaves no empty grid places (9 heads: 3 x 3).
    columns = next((c for c in (columns, 4, 3, 5, 6) if num_heads % c == 0), columns)
    columns = max(1, min(columns, num_heads))
    num_rows = -(-num_heads // columns)
    tiles = np.full((num_rows, columns, n, m), np.nan, dtype=np.float32)
    ids = np.full((num_rows, columns, 1), -1, dtype=np.int64)
    for h in range(num_heads):
        tiles[h // columns, h % columns] = attentions_of_layer[h]
        ids[h // columns, h % columns] = h
    # Grid positions past the last head stay NaN, so they draw as blank background.
    labels = [[f"head {r * columns + c}" for c in range(columns)] for r in range(num_rows)]
    gaps = (max(2, -(-n * 3 // 20)), tile_gap(m))  # taller gaps between grid rows hold the head labels
    step_y, step_x = n + gaps[0], m + gaps[1]
    head_labels = [
        dict(
            x=c * step_x + (m - 1) / 2,
            y=r * step_y - 0.6,
            xref="x",
            yref="y",
            yanchor="bottom",
            text=labels[r][c],
            showarrow=False,
            font=dict(size=11),
        )
        for r in range(num_rows)
        for c in range(columns)
        if r * columns + c < num_heads
    ]
    return tiled_heatmap(
        tiles,
        [""] * num_rows,
        [""] * columns,
        key_tokens,
        tokens,
        targets=ids,
        target_hover="<b>head %{customdata[0]}</b><br>strongest: %{text}<br>click to enlarge it below",
        show_token_ticks=(width_hint - 150) / (columns * (m + gaps[1])) >= 11,
        gaps=gaps,
        width_hint=width_hint,
        annotations=head_labels,
        **kwargs,
    )


def difference_map(
    values: np.ndarray,
    labels: list[str],
    *,
    title: str,
    head_averaged: bool = False,
    columns: int = 4,
    width_hint: int = 1000,
    causal: bool = False,
    segment_ids: np.ndarray | None = None,
    key_labels: list[str] | None = None,
) -> go.Figure:
    """Left minus right on the fixed scale ±``DIFFERENCE_SCALE`` (red: the left attends more): ``[H, U, U]``
    as a grid of heads, or ``[1, U, U]`` (``head_averaged``: each side's layer averaged over its heads) as one
    large tile. ``labels`` name the units both sides share (tokens, "sat | lay", or words); ``key_labels`` the
    columns' when they are another text's (two layers of one cross-attention, ``[H, U, V]``)."""
    values = np.asarray(values, dtype=np.float32)
    if head_averaged:
        n = values.shape[-1]
        return head_heatmap(
            values[0],
            labels if key_labels is None else key_labels,
            labels,
            causal=causal,
            segment_ids=segment_ids,
            title=title,
            difference=True,
            height=int(min(900, max(480, 180 + n * 26))),  # one map where a grid would be: larger cells
        )
    return head_grid(
        values,
        labels,
        columns=columns,
        width_hint=width_hint,
        title=title,
        causal=causal,
        segment_ids=segment_ids,
        difference=True,
        zmax=DIFFERENCE_SCALE,
        key_tokens=key_labels,
    )


def model_grid(attentions: np.ndarray, tokens: list[str], layers_across: bool | None = None, **kwargs) -> go.Figure:
    """Every layer x head ``[L, H, n, n]`` as ONE tiled heatmap trace; a click on a tile selects that
    head (the clicked point's ``customdata`` is ``[layer, head]``).

    ``layers_across`` lays the layers out as columns (heads as rows); by default whenever a model has
    more layers than heads (SmolLM2: 30 x 9), so the grid is wider than tall and fits one screen.
    """
    num_layers, num_heads = attentions.shape[:2]
    if layers_across is None:
        layers_across = num_layers > num_heads
    targets = np.stack(np.meshgrid(np.arange(num_layers), np.arange(num_heads), indexing="ij"), axis=-1)
    layer_labels, head_labels = [f"layer {l}" for l in range(num_layers)], [f"head {h}" for h in range(num_heads)]
    if layers_across:
        attentions, targets = attentions.transpose(1, 0, 2, 3), targets.transpose(1, 0, 2)
        # Thirty narrow columns have no room for "layer 12": the column labels shrink to "L12".
        layer_labels, head_labels = head_labels, [f"L{l}" for l in range(num_layers)]
    return tiled_heatmap(
        attentions,
        layer_labels,
        head_labels,
        tokens,
        tokens,
        show_token_ticks=False,
        targets=targets,
        target_hover="<b>layer %{customdata[0]} head %{customdata[1]}</b><br>"
        "strongest: %{text}<br>click to open it in the head view",
        **kwargs,
    )


def attention_lines(
    matrix: np.ndarray,
    tokens: list[str],
    *,
    focus: int | None = None,
    min_weight: float = 0.02,
    strongest: int | None = 2,
    segment_ids: np.ndarray | None = None,
    title: str | None = None,
    key_tokens: list[str] | None = None,
) -> go.Figure:
    """The BertViz-style view: queries on the left, keys on the right, a line per weight (opacity = weight).
    ``key_tokens``: the keys are another text's (cross-attention: target tokens left, source tokens right).

    Lines are grouped into a few opacity bins, each bin one scatter trace (segments separated by None),
    so a 128-token head is ~10 traces, not 16,000. ``focus`` keeps only that query token's lines (all of
    them); for every query at once only its ``strongest`` keys are drawn (all lines of all tokens cross
    into a hairball nobody can read).
    """
    matrix = np.asarray(matrix, dtype=np.float32)
    n, n_keys = matrix.shape
    names = [plotly_text(t) for t in tokens]
    key_names = names if key_tokens is None else [plotly_text(t) for t in key_tokens]
    rows = [focus] if focus is not None else range(n)
    if focus is None and strongest is not None and strongest < n_keys:
        cutoff = -np.sort(-matrix, axis=-1)[:, strongest - 1 : strongest]  # each row's k-th largest weight
        matrix = np.where(matrix >= cutoff, matrix, 0.0)
    edges = np.array([min_weight, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0001])
    traces = []
    for lo, hi in itertools.pairwise(edges):
        xs, ys = [], []
        for i in rows:
            keys = np.flatnonzero((matrix[i] >= lo) & (matrix[i] < hi))
            for j in keys:
                xs += [0.0, 1.0, None]
                ys += [-i, -int(j), None]
        if xs:
            traces.append(
                dict(
                    type="scatter",
                    x=xs,
                    y=ys,
                    mode="lines",
                    hoverinfo="skip",
                    showlegend=False,
                    line=dict(color="#3b5bdb", width=2 if focus is not None else 1.5),
                    opacity=float(min(1.0, max(0.12, hi if hi < 1 else 1.0))),
                )
            )
    colors = ["#212529"] * n
    if segment_ids is not None and len(segment_ids) == n:
        colors = ["#212529" if s == 0 else SEGMENT_COLOR for s in segment_ids]
    left_colors = list(colors)
    key_colors = colors if key_tokens is None else ["#212529"] * n_keys
    if focus is not None:
        left_colors[focus] = "#c92a2a"
    focus_weights = matrix[focus] if focus is not None else np.zeros(n_keys)
    # The hovers' words in their templates, the numbers in ``customdata`` (the app translates the words).
    hover_left = "query %{customdata[0]} %{text}<extra></extra>"
    hover_right = "key %{customdata[0]} %{text}" + (
        f"<br>weight (query {focus}): %{{customdata[1]:.4f}}" if focus is not None else ""
    ) + "<extra></extra>"  # fmt: skip
    for x, position, font_colors, hover, labels, numbers in (
        (0.0, "middle left", left_colors, hover_left, names, [[i, 0.0] for i in range(n)]),  # queries
        (
            1.0,
            "middle right",
            key_colors,
            hover_right,
            key_names,
            [[j, float(focus_weights[j])] for j in range(n_keys)],
        ),
    ):
        traces.append(
            dict(
                type="scatter",
                x=[x] * len(labels),
                y=[-i for i in range(len(labels))],
                mode="text",
                text=labels,
                textposition=position,
                textfont=dict(color=font_colors, size=12),
                customdata=numbers,
                hovertemplate=hover,
                showlegend=False,
            )
        )
    longest = max(n, n_keys)
    layout = base_layout_dict(int(min(2600, max(300, 60 + 20 * longest))), title)
    layout.update(xaxis=dict(visible=False, range=[-0.6, 1.6]), yaxis=dict(visible=False, range=[-longest + 0.3, 0.7]))
    return _figure(traces, layout)
