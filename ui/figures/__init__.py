"""Pure Plotly figure builders: arrays and labels in, ``go.Figure`` out; no Streamlit, no metrics, no models.

ui.figures.common     colours, base layout, ``plotly_text`` (user text shown literally)
ui.figures.attention  one head, a layer's heads, the whole model (one tiled trace), lines
ui.figures.curves     per-layer curves of a measurement
ui.figures.roles      the role map and the MDS map of heads
ui.figures.teaching   positional waves and similarities, small matrices with their numbers
ui.figures.causal     the Ablate page: clickable score map, per-token loss bars, experiments, pruning curves
"""

from ui.figures.attention import (
    attention_lines,
    difference_map,
    head_grid,
    head_heatmap,
    model_grid,
    tile_gap,
    tiled_heatmap,
)
from ui.figures.common import (
    ATTENTION_COLORSCALE,
    base_layout,
    enlarge_text,
    high_contrast,
    plotly_text,
    with_axis_room,
)
from ui.figures.curves import layer_curves

__all__ = [
    "ATTENTION_COLORSCALE",
    "attention_lines",
    "difference_map",
    "base_layout",
    "enlarge_text",
    "head_grid",
    "head_heatmap",
    "high_contrast",
    "layer_curves",
    "model_grid",
    "plotly_text",
    "tile_gap",
    "tiled_heatmap",
    "with_axis_room",
]
