"""Positions: the sinusoidal encoding of "Attention Is All You Need", its relative-shift property, and learned position tables."""

import streamlit as st

import mha_core as mc
from mha_core import positional
from ui import shell
from ui.figures import teaching
from ui.i18n import t
from ui.page_positions import PositionsSettings, default_channels
from ui.widgets import charts, messages, sidebar

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

S = PositionsSettings.declarations()
LEARNED_CLIP_PERCENT = 1.0  # the learned map's colour scale: 1st to 99th percentile of the off-diagonal cells

st.title(t("Positions"))
st.markdown(
    t(
        "Attention by itself does not know word order: shuffle the tokens and every head computes the same "
        "weights, shuffled. The original Transformer adds a **positional encoding** to each token's vector: "
        "dimension 2i of position pos is sin(pos / 10000^(2i/d)), dimension 2i+1 is cos of the same angle."
    )
)

left, right = st.columns(2)
num_positions = S["positions"].number(left.slider, step=1)
d_model = S["d_model"].select(right.select_slider)
pe = mc.sinusoidal_encoding(num_positions, d_model)
wavelengths = positional.channel_wavelengths(d_model)

st.subheader(t("1. Waves: one frequency per pair of dimensions"))
channels = S["channels"].multiselect(range(d_model), default=default_channels(d_model))
charts.show_chart(
    teaching.waves_figure(pe, channels, wavelengths, name=t(teaching.WAVE_NAME)),
    key="pe_waves",
    filename="headscope-pe-waves",
)
st.caption(
    t(
        "Dimension 0 repeats every {first} positions; dimension {last} every {slowest}. A popular tutorial says low "
        "dimensions are the slow (low-frequency) ones; its own formula gives the opposite: the first dimensions turn "
        "fastest, the last ones slowest.",
        first=f"{wavelengths[0]:.2f}",
        last=d_model - 2,
        slowest=f"{wavelengths[d_model - 2]:,.0f}",
    )
)

st.subheader(t("2. Every position at once"))
charts.show_chart(teaching.encoding_heatmap(pe), key="pe_heatmap", filename="headscope-pe-heatmap")
st.caption(
    t(
        "Each row is one position's vector. Left columns flicker from row to row (fast waves); right columns "
        "barely change (slow waves). Together they give every position a different pattern, like the hands of a "
        "clock."
    )
)

st.subheader(t("3. How similar are two positions?"))
metric = S["metric"].select(st.radio, horizontal=True)
left, right = st.columns(2)
with left:
    charts.show_chart(
        teaching.similarity_curve(
            mc.similarity_by_distance(pe, metric), t("Similarity against distance (sinusoidal)"), metric
        ),
        key="pe_similarity_curve",
        filename="headscope-pe-similarity",
    )
with right:
    charts.show_chart(
        teaching.similarity_heatmap(mc.position_similarity(pe, metric), f"PE[p] . PE[q] ({t(metric)})"),
        key="pe_similarity_matrix",
        filename="headscope-pe-similarity-matrix",
    )
st.caption(
    t(
        "The dot product of two positions depends only on how far apart they are: sum over i of cos(k w_i). "
        "It is largest at distance 0 and falls (not monotonically) with distance, so nearby positions look alike."
    )
)

st.subheader(t("4. Moving k positions is one matrix"))
st.markdown(
    t(
        "Because sin(a+b) and cos(a+b) are built from sin(a), cos(a), sin(b), cos(b), one fixed matrix "
        "M_k moves *any* position k steps: it rotates each (sin, cos) pair by the angle k w_i."
    )
)
st.latex(
    r"\mathrm{PE}_{p+k} = \mathrm{PE}_p \, M_k, \qquad M_k = \mathrm{diag}\left("
    r"\begin{bmatrix} \cos k\omega_i & -\sin k\omega_i \\ \sin k\omega_i & \cos k\omega_i \end{bmatrix}\right),"
    r"\quad \omega_i = 10000^{-2i/d}"
)
left, right = st.columns(2)
p = S["p"].number(left.number_input, step=1)
k = S["k"].number(right.number_input, minimum=-int(p), step=1)
with messages.error_display():
    check = positional.relative_shift_check(int(p), int(k), d_model)
    charts.show_chart(
        teaching.shift_figure(
            check["pe_p_plus_k"],
            check["pe_p_times_m_k"],
            int(p),
            int(k),
            title=t(
                "{shifted} and {rotated}, dimension by dimension",
                shifted=f"PE[{int(p)} + {int(k)}]",
                rotated=f"PE[{int(p)}] @ M_{int(k)}",
            ),
        ),
        key="pe_shift",
        filename="headscope-pe-shift",
    )
    st.metric(
        t(
            "Largest difference between {shifted} and {rotated}",
            shifted=f"PE[{int(p) + int(k)}]",
            rotated=f"PE[{int(p)}] M_{int(k)}",
        ),
        f"{check['max_abs_diff']:.2e}",
    )
    st.caption(t("The difference is rounding error only (float64): the same M_k works for every p."))

st.subheader(t("5. Learned positions in the model in use"))
model = sidebar.current_model()
name = messages.md_escape(model.name) if model is not None else ""
if model is not None:
    table = model.position_embeddings()
    if table is None:
        st.info(
            t(
                "{name} has no learned position table. Models of its family (SmolLM2 is a Llama) use rotary position "
                "embeddings (RoPE): inside every attention layer, queries and keys are rotated by an angle "
                "proportional to their position, the same 2x2 rotations as M_k above, so the score of two tokens "
                "depends on their distance. There is no table of vectors to compare here.",
                name=name,
            )
        )
    else:
        count = S["learned"].number(st.slider, maximum=int(table.shape[0]), default=min(128, int(table.shape[0])))
        learned = table[:count]
        sinusoidal = mc.sinusoidal_encoding(count, learned.shape[1])
        st.caption(
            t(
                "{name}: a learned table of {positions} positions x {dimensions} dimensions, beside a sinusoidal "
                "encoding of the same size ({metric} similarity).",
                name=name,
                positions=table.shape[0],
                dimensions=table.shape[1],
                metric=t(metric),
            )
        )

        def by_distance(vectors):  # from distance 1: a position with itself is its squared length, not a likeness
            curve = mc.similarity_by_distance(vectors, metric)
            return curve[curve["distance"] >= 1]

        left, right = st.columns(2)
        with left:
            charts.show_chart(
                teaching.similarity_curve(by_distance(sinusoidal), t("Sinusoidal (the formula)"), metric),
                key="pe_model_sinusoidal",
            )
        with right:
            charts.show_chart(
                teaching.similarity_curve(by_distance(learned), t("Learned ({model})", model=model.name), metric),
                key="pe_model_learned",
            )
        charts.show_chart(
            teaching.similarity_heatmap(
                mc.position_similarity(learned, metric),
                t("Learned position vectors of {model} ({metric})", model=model.name, metric=t(metric)),
                clip_percent=LEARNED_CLIP_PERCENT,
            ),
            key="pe_model_matrix",
        )
        st.caption(
            t(
                "Training found position vectors of its own. Where nearby positions are more alike than far ones, "
                "the model learned the same idea the sine waves build in: a bright band along the diagonal of the "
                "map, and a curve higher at small distances. The curves start at distance 1 (a position with itself "
                "is its own squared length). The map's colours span the middle {share}% of the cells off the "
                "diagonal (the colour bar says so), so that no single cell (often position 0, far longer than the "
                "rest) owns the scale; cells beyond are drawn at its ends, and the hover gives every cell's value.",
                share=f"{100 - 2 * LEARNED_CLIP_PERCENT:g}",
            )
        )
