// Headscope's view kit: what every attention view drawn in the browser shares (the head view, the model view and
// the cross-attention view of headview/, the long-document view of longview/, the head table of tableview/). One
// colour scale for one quantity: an attention weight w in [0, 1] is painted the colour the app's Plotly figures give
// it (the palette is mha_core/views/palette.py's ATTENTION_COLORSCALE, sent with every view's data), the cells a
// causal mask hides in one grey, and a view that stretches its colours says so and by how much.
// Also: decoding the packed arrays mha_core/views/packing.py packs (bytes and float32, base64), elements made without
// HTML (user text only ever goes into textContent), and the colour bar every view draws as its legend.
//
// A view's script imports these by name (`import { ... } from "../viewkit/viewkit.js";`): node's test runner
// (tests/js/) resolves that import; for the browser, mha_core/views/assets.py's script() makes the view's files (its
// list in VIEW_FILES) one module without the import lines (Streamlit loads a component's inline script as one module
// from a blob: address, from which a relative import cannot resolve; a saved page fetches nothing).

export const LEVELS = 255; // the colour scale's 256 steps; a packed byte b is the weight b / 255

// "#rrggbb" -> [r, g, b].
export function hexRgb(hex) {
  return [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
}

// The colour scale ([[at, "#rrggbb"], ...], from 0 to 1) as 256 RGB triples: entry b is the colour of weight b / 255,
// interpolated linearly between the two stops around it (as Plotly interpolates a heatmap's colour scale).
export function lookupTable(colorscale) {
  const stops = colorscale.map(([at, hex]) => [at, hexRgb(hex)]);
  const table = new Uint8ClampedArray((LEVELS + 1) * 3);
  for (let b = 0; b <= LEVELS; b++) {
    const t = b / LEVELS;
    let k = 0;
    while (k < stops.length - 2 && t > stops[k + 1][0]) k++;
    const [a, ca] = stops[k];
    const [z, cz] = stops[k + 1];
    const f = z > a ? Math.min(Math.max((t - a) / (z - a), 0), 1) : 0;
    for (let c = 0; c < 3; c++) table[b * 3 + c] = Math.round(ca[c] + f * (cz[c] - ca[c]));
  }
  return table;
}

// The colour-scale step of a value: floor(value * stretch * 255 + 0.5), clamped to 0..255 (stretch 1: the weight
// itself), each operation rounded to float32 as ui/viewkit.steps packs the head view's bytes: one weight, one step.
export function levelOf(value, stretch = 1) {
  const t = Math.fround(value * stretch);
  if (!(t > 0)) return 0; // also NaN
  return t >= 1 ? LEVELS : Math.floor(Math.fround(Math.fround(t * LEVELS) + 0.5));
}

// The [r, g, b] colour of a value on the colour scale ``lut`` (lookupTable), stretched ``stretch`` times.
export function colorOf(lut, value, stretch = 1) {
  const b = levelOf(value, stretch) * 3;
  return [lut[b], lut[b + 1], lut[b + 2]];
}

// Pixel p (its first byte, RGBA) of ``px`` set to the colour of step ``level`` of ``lut``, opaque.
export function setLevel(px, p, lut, level) {
  const b = level * 3;
  px[p] = lut[b];
  px[p + 1] = lut[b + 1];
  px[p + 2] = lut[b + 2];
  px[p + 3] = 255;
}

// Pixel p of ``px`` set to the colour [r, g, b], opaque.
export function setRgb(px, p, rgb) {
  px[p] = rgb[0];
  px[p + 1] = rgb[1];
  px[p + 2] = rgb[2];
  px[p + 3] = 255;
}

// What the server sent as its palette (ui/viewkit.palette()), ready to paint with.
export function paletteOf(data) {
  return {
    lut: lookupTable(data.colorscale),
    signed: data.signed_colorscale ? lookupTable(data.signed_colorscale) : null,
    masked: hexRgb(data.masked_color),
    segment: data.segment_color,
  };
}

// base64 -> bytes.
export function decodeBytes(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

// base64 of little-endian float32 -> floats.
export function decodeFloats(base64) {
  const bytes = decodeBytes(base64);
  return new Float32Array(bytes.buffer, 0, bytes.length / 4);
}

// Images packed one byte a cell, each scaled to its own largest value (ui/viewkit.scaled_bytes): ``count`` cells
// from ``offset`` back as values, byte / 255 * top.
export function unscaled(bytes, offset, count, top) {
  const values = new Float32Array(count);
  for (let k = 0; k < count; k++) values[k] = (bytes[offset + k] / LEVELS) * top;
  return values;
}

// The largest of some values (0 for none).
export function largest(values) {
  let top = 0;
  for (const v of values) if (v > top) top = v;
  return top;
}

// A short number for a label: 3 significant digits, without trailing zeros (0.39, 0.0014, 1).
export function shortNumber(value) {
  if (value === 0) return "0";
  return String(Number(value.toPrecision(3)));
}

// The colour bar's tick labels, top to bottom: the weights at 1, 3/4, 1/2, 1/4 and 0 of the bar (``top``: the
// weight at the bar's top, 1 unless the colours are stretched).
export function tickValues(top = 1) {
  return [1, 0.75, 0.5, 0.25, 0].map((f) => f * top);
}

// A view's words in the page's language: ``strings`` maps each English text (``{name}`` fields) to its translation
// (none: English, the script's own); the function returned gives a text with its fields filled from ``values``.
export function translator(strings) {
  const words = strings || {};
  return (text, values = {}) =>
    (words[text] || text).replace(/\{(\w+)\}/g, (field, name) => (name in values ? String(values[name]) : field));
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The colour bar, the legend of every view: the colour scale from 0 (bottom) to ``top`` (1, or the largest value
// of a stretched view), its ticks in weights, and a title. Its height is the CSS variable --hs-bar-height.
export function colorBar(lut, title = "weight", top = 1) {
  const bar = el("div", "hs-colorbar");
  const ramp = el("canvas", "hs-ramp");
  ramp.width = 1;
  ramp.height = LEVELS + 1;
  const ctx = ramp.getContext("2d");
  const image = ctx.createImageData(1, LEVELS + 1);
  for (let b = 0; b <= LEVELS; b++) setLevel(image.data, (LEVELS - b) * 4, lut, b);
  ctx.putImageData(image, 0, 0);
  const ticks = el("div", "hs-ticks");
  tickValues(top).forEach((t) => ticks.append(el("span", "hs-tick", shortNumber(t))));
  bar.append(el("div", "hs-bar-title", title), ramp, ticks);
  return bar;
}

// ---- Keyboard and screen readers: what every view does so that it can be used without a mouse or without sight.

// The ``k`` keys a query's row of weights puts the most on, largest first (ties: the earlier key), each
// { index, token, weight }; ``weightOf(j)`` gives key j's weight, ``visible(j)`` false for keys a mask hides.
export function topKeys(count, weightOf, keyTokens, k = 3, visible = () => true) {
  const order = [];
  for (let j = 0; j < count; j++) if (visible(j)) order.push(j);
  order.sort((a, b) => weightOf(b) - weightOf(a) || a - b);
  return order.slice(0, k).map((j) => ({ index: j, token: keyTokens[j], weight: weightOf(j) }));
}

// One query's row in words: 'query 3 "cat" attends most to "the" (0.52), "cat" (0.30), "[CLS]" (0.12)'.
// ``template``: the sentence in the page's language, its {noun}, {i}, {token} and {tops} filled in once each.
export function describeRow(noun, i, token, tops, template = ROW_WORDS) {
  const parts = tops.map((t) => `"${t.token}" (${t.weight.toFixed(2)})`);
  const values = { noun, i, token, tops: parts.join(", ") };
  return template.replace(/\{(\w+)\}/g, (field, name) => (name in values ? String(values[name]) : field));
}
export const ROW_WORDS = '{noun} {i} "{token}" attends most to {tops}';

// Where an arrow key moves a cursor on a rows x cols grid: [row, col] after ``key`` (Home/End: the row's first or
// last column, PageUp/PageDown: the first or last row), clamped to the grid; null for any other key.
export function moveCursor(row, col, key, rows, cols) {
  const clamp = (v, n) => Math.min(Math.max(v, 0), n - 1);
  const moves = {
    ArrowUp: [row - 1, col],
    ArrowDown: [row + 1, col],
    ArrowLeft: [row, col - 1],
    ArrowRight: [row, col + 1],
    Home: [row, 0],
    End: [row, cols - 1],
    PageUp: [0, col],
    PageDown: [rows - 1, col],
  };
  const to = moves[key];
  return to ? [clamp(to[0], rows), clamp(to[1], cols)] : null;
}

// A polite live region (screen readers read what it says after each change), visible as a status line too.
export function liveRegion(className) {
  const region = el("div", className);
  region.setAttribute("role", "status");
  region.setAttribute("aria-live", "polite");
  return region;
}

// Makes ``node`` focusable and operable like a button: Enter and Space run ``action``.
export function asButton(node, label, action) {
  node.tabIndex = 0;
  node.setAttribute("role", "button");
  node.setAttribute("aria-label", label);
  node.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      action();
    }
  });
}

// The cells a causal mask hides, as a CSS polygon over a grid of ``cols`` columns whose row r hides its cells from
// column ``firstHidden[r]`` on (the upper right staircase); cells are ``w`` x ``h`` in ``unit`` (px, or % of the
// grid). Drawn over the masked colour with a hatch, so a hidden cell is told from a zero weight by its texture
// too, not by colour alone. null when nothing is hidden.
export function maskPolygon(firstHidden, cols, w, h, unit = "px") {
  const points = [];
  firstHidden.forEach((first, r) => {
    const x = Math.min(first, cols) * w;
    points.push([x, r * h], [x, (r + 1) * h]);
  });
  if (!points.length || firstHidden.every((first) => first >= cols)) return null;
  points.push([cols * w, firstHidden.length * h], [cols * w, 0]);
  const at = (v) => `${Number(v.toFixed(4))}${unit}`;
  return `polygon(${points.map(([x, y]) => `${at(x)} ${at(y)}`).join(", ")})`;
}
