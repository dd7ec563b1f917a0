// Headscope's deep-zoom view of a long run (ui/longview/__init__.py). The head view: every head of a layer as an
// overview, and one head's region zoomed (exact values pooled from exact blocks, max or mean, down to single
// tokens with their labels). Drag on the zoomed head to zoom into a rectangle; the arrows pan, "Zoom out" doubles
// the region, a click on a small head shows that head whole. Each gesture goes back to the server as component
// state ("zoom"), which answers with that region pooled from exact blocks. The model view: every head of every
// layer at overview level. Tokens are user text: they only go into textContent or canvas pixels, never HTML.
// Colours: a weight is painted the colour the head view and the app's figures give it (the view kit's one colour
// scale, ui/viewkit), with a colour bar; "Stretch colours" paints each image against its own largest value
// instead, and then the colour bar's ticks and the legend say by how much.
// After painting, the root gets data-drawn="<sig>:<layer>:<head>:<r0>-<r1>:<c0>-<c1>:<reduce>:<colour>" (head view)
// or "<sig>:model:<reduce>:<colour>"; data-values holds the zoomed cells' values (row-major), for tests.
// The pure parts (pixels, stretch, regions, legend) are exported by name too, for node's test runner
// (tests/js/longview.test.mjs); Streamlit uses the default export.

import {
  ROW_WORDS,
  asButton,
  colorBar,
  decodeBytes,
  decodeFloats,
  el,
  largest,
  levelOf,
  liveRegion,
  maskPolygon,
  moveCursor,
  paletteOf,
  setLevel,
  setRgb,
  shortNumber,
  topKeys,
  translator,
  unscaled,
} from "../viewkit/viewkit.js";

const ABSOLUTE = "absolute";
// What a screen reader says of the zoomed head (one literal: ui/longview's VIEW_TEXTS lists it, a test reads it here).
const ZOOM_LABEL = "The zoomed head: arrow keys move between cells, Enter zooms into the cell (at single tokens: reads the row's top keys), Escape zooms out.";
const STRETCHED = "stretched";

// How many times an image's values are multiplied before they are coloured: 1 on the weights' own scale, or
// 1 / its largest value when the colours are stretched (so that value is the darkest colour).
function stretchOf(colour, top) {
  return colour === STRETCHED && top > 0 ? 1 / top : 1;
}

// A decoder's cell [a, b] is hidden when every key of it comes after every query of it.
function hiddenCell(rowEdges, colEdges, a, b) {
  return colEdges[b] > rowEdges[a + 1] - 1;
}

// RGBA pixels of a rows x cols image of values (row-major) whose cells span the token edges given: each the colour
// of value * stretch, the masked colour where a causal mask hides the whole cell.
function valuePixels(values, rowEdges, colEdges, causal, palette, stretch) {
  const rows = rowEdges.length - 1;
  const cols = colEdges.length - 1;
  const px = new Uint8ClampedArray(rows * cols * 4);
  for (let a = 0; a < rows; a++) {
    for (let b = 0; b < cols; b++) {
      const p = (a * cols + b) * 4;
      if (causal && hiddenCell(rowEdges, colEdges, a, b)) setRgb(px, p, palette.masked);
      else setLevel(px, p, palette.lut, levelOf(values[a * cols + b], stretch));
    }
  }
  return px;
}

function paint(canvas, px, rows, cols) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(cols, rows);
  image.data.set(px);
  ctx.putImageData(image, 0, 0);
}

// The region [r0, r1) x [c0, c1) moved inside a document of n tokens, at least one token and at most n a side.
function fitRegion(n, r0, r1, c0, c1) {
  const fit = (lo, hi) => {
    const width = Math.max(1, Math.min(hi - lo, n));
    lo = Math.max(0, Math.min(lo, n - width));
    return [lo, lo + width];
  };
  return [...fit(r0, r1), ...fit(c0, c1)];
}

// The region moved by a share of its own size (rowsBy, colsBy: -0.5 = half a region earlier).
function panned(n, region, rowsBy, colsBy) {
  const [r0, r1, c0, c1] = region;
  const dr = Math.round((r1 - r0) * rowsBy);
  const dc = Math.round((c1 - c0) * colsBy);
  return fitRegion(n, r0 + dr, r1 + dr, c0 + dc, c1 + dc);
}

// Twice the region, around its centre.
function zoomedOut(n, region) {
  const [r0, r1, c0, c1] = region;
  const hr = Math.ceil((r1 - r0) / 2);
  const hc = Math.ceil((c1 - c0) / 2);
  return fitRegion(n, r0 - hr, r1 + hr, c0 - hc, c1 + hc);
}

// Canvas pixel -> cell index along one axis.
function cellAt(edgesCount, pixel, extent) {
  return Math.min(edgesCount - 2, Math.max(0, Math.floor((pixel / extent) * (edgesCount - 1))));
}

// What the zoomed head's colours mean, in words (``tr``: the page's language, viewkit's ``translator``).
function legendText({ tokenLevel, reduce, rowsPerCell, colsPerCell, colour, top }, tr = translator()) {
  const cells = tokenLevel
    ? tr("Single tokens: each cell is one exact weight.")
    : tr("Each cell: the {reduce} of the exact weights of up to {rows} x {cols} tokens.", {
        reduce: tr(reduce),
        rows: rowsPerCell,
        cols: colsPerCell,
      });
  const scale =
    colour === STRETCHED && top > 0
      ? tr(" Colours stretched x{factor}: the darkest is {top}, this view's largest {what}, not 1 (the colour bar's ticks are the values).", {
          factor: shortNumber(1 / top),
          top: shortNumber(top),
          what: tr(tokenLevel ? "weight" : "cell"),
        })
      : tr(" Colours: the weights' one scale, as in the head view (white 0, dark blue 1).");
  return cells + scale + (tokenLevel ? "" : tr(" Drag to zoom."));
}

function send(s, zoom) {
  s.pending = zoom;
  s.root.classList.add("hs-lv-busy");
  s.status.textContent = s.tr("Pooling the exact weights of that region...");
  s.setStateValue("zoom", zoom);
}

// The zoom the view shows now, with some of it changed.
function zoomWith(s, change) {
  const [r0, r1, c0, c1] = s.region;
  return { layer: s.layer, head: s.head, r0, r1, c0, c1, reduce: s.reduce, view: s.view, colour: s.colour, ...change };
}

function regionZoom(s, region) {
  const [r0, r1, c0, c1] = region;
  return zoomWith(s, { r0, r1, c0, c1 });
}

function build(root, s) {
  root.replaceChildren();
  const bar = el("div", "hs-lv-bar");
  const button = (label, title, action, cls) => {
    const b = el("button", "hs-lv-button" + (cls ? " " + cls : ""), s.tr(label));
    b.type = "button";
    b.title = title = s.tr(title);
    b.addEventListener("click", action);
    if (!/\w/.test(label)) b.setAttribute("aria-label", title); // an arrow glyph: its title is its name
    bar.appendChild(b);
    return b;
  };
  s.viewButton = button("Model view", "Every head of every layer at overview level", () =>
    send(s, zoomWith(s, { view: s.view === "head" ? "model" : "head" })),
  );
  s.reduceButton = button("Mean pooling", "Pool each cell by the mean of its weights instead of the largest", () =>
    send(s, zoomWith(s, { reduce: s.reduce === "mean" ? "max" : "mean" })),
  );
  s.colourButton = button("Stretch colours", "Paint each image against its own largest value", () =>
    send(s, zoomWith(s, { colour: s.colour === STRETCHED ? ABSOLUTE : STRETCHED })),
  );
  s.layerDown = button("Layer -", "The layer before", () => send(s, zoomWith(s, { layer: Math.max(0, s.layer - 1) })));
  s.layerUp = button("Layer +", "The next layer", () =>
    send(s, zoomWith(s, { layer: Math.min(s.layers - 1, s.layer + 1) })),
  );
  s.panButtons = [
    button("\u2190", "Pan to earlier keys", () => send(s, regionZoom(s, panned(s.n, s.region, 0, -0.5))), "hs-lv-pan-left"),
    button("\u2192", "Pan to later keys", () => send(s, regionZoom(s, panned(s.n, s.region, 0, 0.5))), "hs-lv-pan-right"),
    button("\u2191", "Pan to earlier queries", () => send(s, regionZoom(s, panned(s.n, s.region, -0.5, 0))), "hs-lv-pan-up"),
    button("\u2193", "Pan to later queries", () => send(s, regionZoom(s, panned(s.n, s.region, 0.5, 0))), "hs-lv-pan-down"),
    button("Zoom out", "Twice the region", () => send(s, regionZoom(s, zoomedOut(s.n, s.region))), "hs-lv-zoom-out"),
    button("Whole head", "The whole head", () => send(s, regionZoom(s, [0, s.n, 0, s.n])), "hs-lv-whole"),
  ];
  root.appendChild(bar);
  s.title = el("div", "hs-lv-title");
  root.appendChild(s.title);
  s.status = el("div", "hs-lv-status");
  root.appendChild(s.status);

  s.headPanel = el("div", "hs-lv-headview");
  s.grid = el("div", "hs-lv-grid");
  s.gridNote = el("div", "hs-lv-gridnote");
  const gridBox = el("div", "hs-lv-gridbox");
  gridBox.append(s.grid, s.gridNote);
  s.headPanel.appendChild(gridBox);
  const zoomBox = el("div", "hs-lv-zoombox");
  s.colLabels = el("div", "hs-lv-collabels");
  s.rowLabels = el("div", "hs-lv-rowlabels");
  s.stage = el("div", "hs-lv-stage");
  s.big = el("canvas", "hs-lv-big");
  s.rect = el("div", "hs-lv-rect");
  s.hatch = el("div", "hs-mask-hatch");
  s.cursorBox = el("div", "hs-cursor");
  s.stage.append(s.big, s.hatch, s.rect, s.cursorBox);
  s.big.tabIndex = 0;
  s.big.setAttribute("role", "application");
  s.big.setAttribute("aria-roledescription", s.tr("zoomed attention head"));
  s.big.setAttribute(
    "aria-label",
    s.tr(ZOOM_LABEL),
  );
  s.big.addEventListener("focus", () => {
    if (!s.cursor) s.cursor = [0, 0];
    showCursor(s);
  });
  s.big.addEventListener("blur", () => {
    s.cursorBox.style.display = "none";
  });
  s.big.addEventListener("keydown", (event) => keyOnZoom(s, event));
  s.barSlot = el("div", "hs-lv-barslot");
  const middle = el("div", "hs-lv-middle");
  middle.append(s.rowLabels, s.stage, s.barSlot);
  zoomBox.append(s.colLabels, middle);
  s.readout = liveRegion("hs-lv-readout");
  s.legend = el("div", "hs-lv-legend");
  zoomBox.append(s.readout, s.legend);
  s.headPanel.appendChild(zoomBox);
  root.appendChild(s.headPanel);
  s.modelPanel = el("div", "hs-lv-modelpanel");
  s.modelGrid = el("div", "hs-lv-model");
  s.modelBar = el("div", "hs-lv-modelbar");
  s.modelPanel.append(s.modelGrid, s.modelBar);
  root.appendChild(s.modelPanel);

  // Drag to zoom: a rectangle in canvas pixels, turned into the cells' token edges on release.
  const point = (event) => {
    const box = s.big.getBoundingClientRect();
    return [Math.min(Math.max(event.clientX - box.left, 0), box.width), Math.min(Math.max(event.clientY - box.top, 0), box.height), box];
  };
  s.big.addEventListener("pointerdown", (event) => {
    const [x, y] = point(event);
    s.drag = { x, y };
    s.big.setPointerCapture(event.pointerId);
  });
  s.big.addEventListener("pointermove", (event) => {
    const [x, y, box] = point(event);
    const a = cellAt(s.rowEdges.length, y, box.height);
    const b = cellAt(s.colEdges.length, x, box.width);
    describeCell(s, a, b);
    if (!s.drag) return;
    const left = Math.min(s.drag.x, x);
    const topPx = Math.min(s.drag.y, y);
    Object.assign(s.rect.style, {
      display: "block",
      left: `${left}px`,
      top: `${topPx}px`,
      width: `${Math.abs(x - s.drag.x)}px`,
      height: `${Math.abs(y - s.drag.y)}px`,
    });
  });
  s.big.addEventListener("pointerup", (event) => {
    if (!s.drag) return;
    const [x, y, box] = point(event);
    const start = s.drag;
    s.drag = null;
    s.rect.style.display = "none";
    if (Math.abs(x - start.x) < 4 && Math.abs(y - start.y) < 4) return; // a click: the readout says the value
    const a0 = cellAt(s.rowEdges.length, Math.min(start.y, y), box.height);
    const a1 = cellAt(s.rowEdges.length, Math.max(start.y, y), box.height);
    const b0 = cellAt(s.colEdges.length, Math.min(start.x, x), box.width);
    const b1 = cellAt(s.colEdges.length, Math.max(start.x, x), box.width);
    send(s, regionZoom(s, fitRegion(s.n, s.rowEdges[a0], s.rowEdges[a1 + 1], s.colEdges[b0], s.colEdges[b1 + 1])));
  });
}

function span(edges, k) {
  const first = edges[k];
  const last = edges[k + 1] - 1;
  return first === last ? `${first}` : `${first}-${last}`;
}

function describeCell(s, a, b) {
  const cols = s.colEdges.length - 1;
  const value = s.values[a * cols + b];
  const hidden = s.causal && hiddenCell(s.rowEdges, s.colEdges, a, b);
  const shown = hidden ? s.tr("hidden by the causal mask") : value.toPrecision(4);
  if (s.tokenLevel) {
    s.readout.textContent = s.tr('query {i} "{token}" -> key {j} "{keyToken}": {shown}', {
      i: s.rowEdges[a],
      token: s.rowTokens[a],
      j: s.colEdges[b],
      keyToken: s.colTokens[b],
      shown,
    });
  } else {
    s.readout.textContent = s.tr("queries {rows}, keys {cols}: {shown}", {
      rows: span(s.rowEdges, a),
      cols: span(s.colEdges, b),
      shown: hidden ? shown : `${s.tr(s.reduce)} ${shown}`,
    });
  }
}

// The keyboard's cell on the zoomed head: framed, and what it holds said in the readout (a live region).
function showCursor(s) {
  const rows = s.rowEdges.length - 1;
  const cols = s.colEdges.length - 1;
  const [a, b] = [Math.min(s.cursor[0], rows - 1), Math.min(s.cursor[1], cols - 1)];
  s.cursor = [a, b];
  Object.assign(s.cursorBox.style, {
    display: "block",
    left: `${(100 * b) / cols}%`,
    top: `${(100 * a) / rows}%`,
    width: `${100 / cols}%`,
    height: `${100 / rows}%`,
  });
  describeCell(s, a, b);
  s.root.dataset.cursor = `${a},${b}`;
}

// The row of cell a's top keys in words, at single tokens (the keys a causal mask hides left out).
function rowWords(s, a, k = 5) {
  const cols = s.colEdges.length - 1;
  const visible = (b) => !(s.causal && hiddenCell(s.rowEdges, s.colEdges, a, b));
  const tops = topKeys(cols, (b) => s.values[a * cols + b], s.colTokens, k, visible);
  return describeRow(s.tr("query"), s.rowEdges[a], s.rowTokens[a], tops, s.tr(ROW_WORDS));
}

function keyOnZoom(s, event) {
  if (!s.cursor || s.view !== "head") return;
  if (event.key === "Escape") {
    event.preventDefault();
    s.cursor = [0, 0];
    send(s, regionZoom(s, zoomedOut(s.n, s.region)));
    return;
  }
  if (event.key === "Enter") {
    event.preventDefault();
    const [a, b] = s.cursor;
    if (s.tokenLevel) {
      s.readout.textContent = `${rowWords(s, a)}.`;
      return;
    }
    s.cursor = [0, 0];
    send(s, regionZoom(s, fitRegion(s.n, s.rowEdges[a], s.rowEdges[a + 1], s.colEdges[b], s.colEdges[b + 1])));
    return;
  }
  const to = moveCursor(s.cursor[0], s.cursor[1], event.key, s.rowEdges.length - 1, s.colEdges.length - 1);
  if (!to) return;
  event.preventDefault();
  s.cursor = to;
  showCursor(s);
}

function drawLabels(s) {
  s.rowLabels.replaceChildren();
  s.colLabels.replaceChildren();
  if (!s.tokenLevel) return;
  s.rowTokens.forEach((token, k) => {
    const label = el("div", "hs-lv-rowlabel", `${s.rowEdges[k]} ${token}`);
    label.style.height = `${100 / s.rowTokens.length}%`;
    s.rowLabels.appendChild(label);
  });
  s.colTokens.forEach((token, k) => {
    const label = el("div", "hs-lv-collabel", `${s.colEdges[k]} ${token}`);
    label.style.width = `${100 / s.colTokens.length}%`;
    s.colLabels.appendChild(label);
  });
}

// Every head's overview of a layer, or every head of the model: one small canvas each, painted from images scaled to
// their own largest cell (``tops``), on the weights' scale or each stretched to its own largest cell.
function overviewCanvas(s, data, k, bytes) {
  const size = data.grid_size;
  const top = data.grid_tops[k];
  const values = unscaled(bytes, k * size * size, size * size, top);
  const canvas = el("canvas");
  paint(canvas, valuePixels(values, data.grid_edges, data.grid_edges, s.causal, s.palette, stretchOf(s.colour, top)), size, size);
  const stretched = s.colour === STRETCHED && top > 0 ? s.tr("; colours stretched x{factor}", { factor: shortNumber(1 / top) }) : "";
  return { canvas, about: s.tr("largest cell {top}", { top: shortNumber(top) }) + stretched };
}

function renderHead(s, data) {
  s.headPanel.style.display = "";
  s.modelPanel.style.display = "none";
  const bytes = decodeBytes(data.grid);
  s.grid.replaceChildren();
  for (let h = 0; h < data.num_heads; h++) {
    const cell = el("div", "hs-lv-thumb" + (h === data.head ? " hs-lv-selected" : ""));
    const { canvas, about } = overviewCanvas(s, data, h, bytes);
    canvas.className = "hs-lv-thumbcanvas";
    cell.append(canvas, el("div", "hs-lv-thumblabel", s.tr("head {head}", { head: h })));
    cell.title = s.tr("Layer {layer}, head {head}: the whole head ({about})", { layer: data.layer, head: h, about });
    const whole = () => send(s, zoomWith(s, { head: h, r0: 0, r1: s.n, c0: 0, c1: s.n }));
    cell.addEventListener("click", whole);
    const label = h === data.head ? "Layer {layer}, head {head} (shown): the whole head" : "Layer {layer}, head {head}: the whole head";
    asButton(cell, s.tr(label, { layer: data.layer, head: h }), whole);
    cell.setAttribute("aria-pressed", String(h === data.head));
    cell.addEventListener("keydown", (event) => {
      const step = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
      const next = step && s.grid.children[h + step];
      if (!next) return;
      event.preventDefault();
      next.focus();
    });
    s.grid.appendChild(cell);
  }
  s.gridNote.textContent = s.tr(
    s.colour === STRETCHED
      ? "Each whole head ({reduce} pooling), its colours stretched to its own largest cell."
      : "Each whole head ({reduce} pooling), on the weights' scale.",
    { reduce: s.tr(data.reduce) },
  );
  s.values = decodeFloats(data.values);
  s.rowEdges = data.row_edges;
  s.colEdges = data.col_edges;
  s.tokenLevel = data.token_level;
  s.rowTokens = data.row_tokens;
  s.colTokens = data.col_tokens;
  const top = largest(s.values);
  const stretch = stretchOf(s.colour, top);
  paint(s.big, valuePixels(s.values, s.rowEdges, s.colEdges, s.causal, s.palette, stretch), s.rowEdges.length - 1, s.colEdges.length - 1);
  s.barSlot.replaceChildren(colorBar(s.palette.lut, stretch === 1 ? s.tr("weight") : `x${shortNumber(stretch)}`, 1 / stretch));
  drawLabels(s);
  const cols = s.colEdges.length - 1;
  const firstHidden = Array.from({ length: s.rowEdges.length - 1 }, (_, a) => {
    let b = 0;
    while (b < cols && !hiddenCell(s.rowEdges, s.colEdges, a, b)) b++;
    return b;
  });
  const clip = s.causal ? maskPolygon(firstHidden, cols, 100 / cols, 100 / firstHidden.length, "%") : null;
  Object.assign(s.hatch.style, { display: clip ? "block" : "none", width: "100%", height: "100%", clipPath: clip || "" });
  if (s.cursor && document.activeElement === s.big) showCursor(s);
  const [r0, r1, c0, c1] = data.region;
  const rowsPerCell = Math.ceil((r1 - r0) / (s.rowEdges.length - 1));
  const colsPerCell = Math.ceil((c1 - c0) / (s.colEdges.length - 1));
  s.title.textContent = s.tr("Layer {layer}, head {head}: queries {r0}-{r1}, keys {c0}-{c1} of {n} tokens", {
    layer: data.layer,
    head: data.head,
    r0,
    r1: r1 - 1,
    c0,
    c1: c1 - 1,
    n: data.n,
  });
  const legend = { tokenLevel: s.tokenLevel, reduce: data.reduce, rowsPerCell, colsPerCell, colour: s.colour, top };
  s.legend.textContent = legendText(legend, s.tr);
  s.root.dataset.values = JSON.stringify(Array.from(s.values, (v) => Number(v.toPrecision(8))));
  s.root.dataset.region = JSON.stringify(data.region);
  s.root.dataset.stretch = String(stretch);
  s.root.dataset.drawn = `${data.sig}:${data.layer}:${data.head}:${r0}-${r1}:${c0}-${c1}:${data.reduce}:${s.colour}`;
}

function renderModel(s, data) {
  s.headPanel.style.display = "none";
  s.modelPanel.style.display = "";
  const bytes = decodeBytes(data.grid);
  s.modelGrid.replaceChildren();
  s.modelGrid.style.setProperty("--hs-lv-heads", String(data.num_heads));
  for (let layer = 0; layer < data.num_layers; layer++) {
    s.modelGrid.appendChild(el("div", "hs-lv-modellabel", `L${layer}`));
    for (let h = 0; h < data.num_heads; h++) {
      const { canvas, about } = overviewCanvas(s, data, layer * data.num_heads + h, bytes);
      canvas.className = "hs-lv-modelcanvas";
      canvas.title = s.tr("Layer {layer}, head {head} ({about}): click to zoom", { layer, head: h, about });
      const zoom = () => send(s, zoomWith(s, { layer, head: h, r0: 0, r1: s.n, c0: 0, c1: s.n, view: "head" }));
      canvas.addEventListener("click", zoom);
      asButton(canvas, s.tr("Layer {layer}, head {head}: Enter zooms into it", { layer, head: h }), zoom);
      canvas.addEventListener("keydown", (event) => {
        const to = moveCursor(layer, h, event.key, data.num_layers, data.num_heads);
        if (!to || event.key === "Home" || event.key === "End" || event.key.startsWith("Page")) return;
        event.preventDefault();
        s.modelGrid.querySelectorAll("canvas")[to[0] * data.num_heads + to[1]].focus();
      });
      s.modelGrid.appendChild(canvas);
    }
  }
  const size = data.grid_size;
  const colours = s.tr(
    s.colour === STRETCHED ? "each head's colours stretched to its own largest cell (hover a head for how much)" : "on the weights' scale",
  );
  s.modelBar.replaceChildren(colorBar(s.palette.lut, s.tr(s.colour === STRETCHED ? "share of its largest" : "weight"), 1));
  s.title.textContent = s.tr(
    "Every head at overview level ({reduce} of exact weights, {size} x {size} cells, {colours}); click a head to zoom",
    { reduce: s.tr(data.reduce), size, colours },
  );
  s.root.dataset.drawn = `${data.sig}:model:${data.reduce}:${s.colour}`;
}

export default function (component) {
  const { data, parentElement, setStateValue } = component;
  const root = parentElement.querySelector(".hs-longview");
  if (!root || !data) return;
  const s = root.__longview || { root, pending: null };
  root.__longview = s;
  s.setStateValue = setStateValue;
  const words = JSON.stringify(data.strings || {});
  if (!s.bar || s.words !== words) {
    // the view's words in the page's language (data.strings; none: English): built again when they change
    s.tr = translator(data.strings);
    s.words = words;
    build(root, s);
    s.bar = true;
  }
  s.palette = paletteOf(data);
  s.n = data.n;
  s.layers = data.num_layers;
  s.layer = data.layer;
  s.head = data.head;
  s.reduce = data.reduce;
  s.view = data.view;
  s.colour = data.colour;
  s.region = data.region;
  s.causal = Boolean(data.causal);
  s.pending = null;
  root.classList.remove("hs-lv-busy");
  s.status.textContent = "";
  s.viewButton.textContent = s.tr(data.view === "head" ? "Model view" : "Head view");
  s.reduceButton.textContent = s.tr(data.reduce === "mean" ? "Max pooling" : "Mean pooling");
  s.colourButton.textContent = s.tr(data.colour === STRETCHED ? "Weights' colours" : "Stretch colours");
  s.layerDown.disabled = data.view !== "head" || data.layer === 0;
  s.layerUp.disabled = data.view !== "head" || data.layer === data.num_layers - 1;
  for (const b of s.panButtons) b.disabled = data.view !== "head";
  root.style.setProperty("--hs-scale", String(data.text_scale || 1));
  if (data.view === "model") renderModel(s, data);
  else renderHead(s, data);
}

export { cellAt, fitRegion, hiddenCell, legendText, panned, stretchOf, valuePixels, zoomedOut };
