// Headscope's head table view (mha_core/views/tables.py packs it): a table with one row per head (head metrics, roles,
// importance: any table with layer and head columns) as a layer x head grid, each cell the colour of the chosen
// column's value on the weights' colour scale, stretched from 0 to the largest value, or, for a column with a
// value below zero (patching and attribution effects), on the signed scale from -m to m, white at 0, as the app's
// maps draw them (the colour bar says which values). A click on a cell shows that head's rows in words; the column
// is picked in a list.
// Text from the table (column names, values) only ever goes into textContent, never HTML. The view's own words are
// English unless its data sends them in another language (``data.strings``: mha_core/views/tables.py's VIEW_TEXTS).
// After painting, the root gets data-drawn="<sig>:<column>".

import { colorBar, colorOf, decodeFloats, el, paletteOf, shortNumber, translator } from "../viewkit/viewkit.js";

// The colour scale's ends for some values: [min(0, smallest), largest] of the finite ones, never empty.
function valueRange(values) {
  let lo = 0;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (!(hi > lo)) hi = lo + 1;
  return [lo, hi];
}

// How a column is coloured: values below zero on the signed scale from -m to m (m the largest magnitude: white at
// 0), others on the weights' scale from 0 to the largest.
function scaleOf(values) {
  const [lo, hi] = valueRange(values);
  if (lo < 0) {
    const m = Math.max(-lo, hi > 0 ? hi : 0);
    return { signed: true, lo: -m, hi: m };
  }
  return { signed: false, lo, hi };
}

// Cell [layer, head] of a grid of ``layers`` x ``heads`` cells drawn in ``box`` under the point (x, y), or null.
function cellAt(box, layers, heads, x, y) {
  const head = Math.floor(((x - box.left) / box.width) * heads);
  const layer = Math.floor(((y - box.top) / box.height) * layers);
  return layer >= 0 && layer < layers && head >= 0 && head < heads ? [layer, head] : null;
}

function paint(s) {
  const values = s.values[s.column];
  const { signed, lo, hi } = scaleOf(values);
  const lut = signed && s.signed ? s.signed : s.lut;
  const ctx = s.canvas.getContext("2d");
  const image = ctx.createImageData(s.heads, s.layers);
  for (let k = 0; k < values.length; k++) {
    const rgb = Number.isFinite(values[k]) ? colorOf(lut, (values[k] - lo) / (hi - lo)) : s.masked;
    image.data.set([rgb[0], rgb[1], rgb[2], 255], k * 4);
  }
  ctx.putImageData(image, 0, 0);
  const bar = colorBar(lut, signed ? s.tr("{column} (blue < 0 < red)", { column: s.column }) : s.column, 1);
  bar.querySelectorAll(".hs-tick").forEach((tick, i) => {
    tick.textContent = shortNumber(lo + (1 - i / 4) * (hi - lo));
  });
  s.bar.replaceChildren(bar);
  s.root.dataset.drawn = `${s.sig}:${s.column}`;
}

// A head's rows in words, under its name: what the view shows for a picked head.
function detailText(tr, layer, head, lines) {
  return [tr("Layer {layer}, head {head}", { layer, head }), ...(lines.length ? lines : [tr("(no row)")])].join("\n");
}

function showDetail(s, layer, head) {
  s.picked = [layer, head];
  s.detail.textContent = detailText(s.tr, layer, head, s.details[layer * s.heads + head] || []);
}

// The view's fixed labels (the column picker's, the axes'), in the words of ``tr``.
function labelWords(tr) {
  return { column: tr("Column "), columnShown: tr("Column shown"), heads: tr("head →"), layers: tr("layer ↓") };
}

function build(root, s) {
  const words = labelWords(s.tr);
  s.picker = el("select", "hs-table-column");
  s.picker.setAttribute("aria-label", words.columnShown);
  s.picker.addEventListener("change", () => {
    s.column = s.picker.value;
    paint(s);
    s.setStateValue("pick", { column: s.column, layer: s.picked[0], head: s.picked[1] });
  });
  s.canvas = el("canvas", "hs-table-canvas");
  s.canvas.addEventListener("click", (event) => {
    const cell = cellAt(s.canvas.getBoundingClientRect(), s.layers, s.heads, event.clientX, event.clientY);
    if (!cell) return;
    showDetail(s, cell[0], cell[1]);
    s.setStateValue("pick", { column: s.column, layer: cell[0], head: cell[1] });
  });
  s.bar = el("div", "hs-table-bar");
  s.detail = el("pre", "hs-table-detail");
  s.detail.setAttribute("aria-live", "polite");
  const body = el("div", "hs-table-body");
  const grid = el("div", "hs-table-grid");
  grid.append(el("div", "hs-table-axis", words.heads), s.canvas);
  body.append(el("div", "hs-table-axis hs-table-layers", words.layers), grid, s.bar);
  const label = el("label", "hs-table-label", words.column);
  label.append(s.picker);
  root.append(label, body, s.detail);
}

export default function (component) {
  const { data, parentElement, setStateValue } = component;
  const root = parentElement.querySelector(".hs-tableview");
  if (!root || !data) return;
  const s = root.__tableview || { root, sig: null };
  root.__tableview = s;
  s.setStateValue = setStateValue;
  s.tr = translator(data.strings);
  if (!s.canvas) build(root, s);
  if (s.sig !== data.sig) {
    s.sig = data.sig;
    s.layers = data.num_layers;
    s.heads = data.num_heads;
    s.details = data.details;
    s.values = Object.fromEntries(Object.entries(data.values).map(([name, raw]) => [name, decodeFloats(raw)]));
    const palette = paletteOf(data);
    s.lut = palette.lut;
    s.signed = palette.signed;
    s.masked = palette.masked;
    s.canvas.width = s.heads;
    s.canvas.height = s.layers;
    root.style.setProperty("--hs-table-aspect", `${s.heads} / ${s.layers}`);
    s.picker.replaceChildren(...data.columns.map((name) => el("option", "", name)));
  }
  s.column = data.column;
  s.picker.value = data.column;
  paint(s);
  showDetail(s, data.layer, data.head);
}

export { cellAt, detailText, labelWords, scaleOf, valueRange };
