// Headscope's attention views (ui/headview/), drawn on canvases. The head view: a layer's heads as small
// canvases and one head enlarged; the model view: every layer x head at once. The data holds every layer of
// the sentence (one byte a weight), so the layer slider, a click on a head and the switch between the two
// views redraw here at once; the choice goes back to the server as component state ("pick", for the link). A cell
// of the enlarged head picked (a click, or Enter on the keyboard's cell) goes back in the pick with its query and key.
// Tokens are user text: they only ever go into textContent, attributes or canvas pixels, never HTML.
// Queries are the rows (s.tokens, s.nq of them) and keys the columns (s.keyTokens, s.nk): the same tokens for
// self-attention, another text's for cross-attention (target tokens down the side, source tokens along the top).
// After painting, the root gets data-drawn="<sig>:<layer>:<head>" (head view) or "<sig>:model" (model
// view); tests and benchmarks wait for it.
// The pure parts (colour scale, weights, layout, picks) are exported by name too, for node's test runner
// (tests/js/headview.test.mjs); Streamlit uses the default export.

import {
  asButton,
  colorBar,
  decodeBytes,
  describeRow,
  ROW_WORDS,
  el,
  liveRegion,
  maskPolygon,
  moveCursor,
  paletteOf,
  setLevel,
  setRgb,
  topKeys,
} from "../viewkit/viewkit.js";

// Where head (layer, head)'s nq x nk bytes start in the sentence's data (only the layers sent are in it).
function headOffset(s, layer, head) {
  return (s.layerIndex.get(layer) * s.heads + head) * s.nq * s.nk;
}

// One head's weights as RGBA pixels, row by row (nq rows of nk): the colour scale's colour of each byte, the
// masked colour above the diagonal of a causal model.
function headPixels(s, layer, head, px = new Uint8ClampedArray(s.nq * s.nk * 4)) {
  const nq = s.nq, nk = s.nk;
  const offset = headOffset(s, layer, head);
  for (let i = 0; i < nq; i++) {
    for (let j = 0; j < nk; j++) {
      const p = (i * nk + j) * 4;
      if (s.causal && j > i) setRgb(px, p, s.masked);
      else setLevel(px, p, s.lut, s.bytes[offset + i * nk + j]);
    }
  }
  return px;
}

// One head's nq x nk weights painted into an nk-wide, nq-high canvas (CSS scales it up, pixelated).
function paint(canvas, s, layer, head) {
  const nq = s.nq, nk = s.nk;
  if (canvas.width !== nk) canvas.width = nk;
  if (canvas.height !== nq) canvas.height = nq;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(nk, nq);
  headPixels(s, layer, head, image.data);
  ctx.putImageData(image, 0, 0);
}

function weight(s, layer, head, i, j) {
  return s.bytes[headOffset(s, layer, head) + i * s.nk + j] / s.levels;
}

// The cell [query i, key j] of an nq x nk grid drawn in ``box`` under the point (x, y), or null outside it.
function cellIndex(box, nq, nk, x, y) {
  const j = Math.floor(((x - box.left) / box.width) * nk);
  const i = Math.floor(((y - box.top) / box.height) * nq);
  return i >= 0 && i < nq && j >= 0 && j < nk ? [i, j] : null;
}

function cellAt(canvas, s, event) {
  return cellIndex(canvas.getBoundingClientRect(), s.nq, s.nk, event.clientX, event.clientY);
}

function hoverText(s, layer, head, i, j) {
  const where = tr('{query} {i} "{token}" -> {key} {j} "{keyToken}"', {
    query: s.queryNoun,
    i,
    token: s.tokens[i],
    key: s.keyNoun,
    j,
    keyToken: s.keyTokens[j],
  });
  if (s.causal && j > i) return tr("{where}: hidden by the causal mask", { where });
  return `${where}: ${weight(s, layer, head, i, j).toFixed(3)}`;
}

// The top keys of query i of a head, in words (the keys a causal mask hides left out).
function rowWords(s, layer, head, i, k = 3) {
  const tops = topKeys(s.nk, (j) => weight(s, layer, head, i, j), s.keyTokens, k, (j) => !(s.causal && j > i));
  return describeRow(s.queryNoun, i, s.tokens[i], tops, tr(ROW_WORDS));
}

// The text alternative of a head: every query's top keys in words (at most ``limit`` queries), for screen readers.
function headWords(s, layer, head, limit = 64) {
  const lines = [
    tr("Layer {layer}, head {head}: each {query} token and the {key} tokens it attends to most.", {
      layer,
      head,
      query: s.queryNoun,
      key: s.keyNoun,
    }),
  ];
  for (let i = 0; i < Math.min(s.nq, limit); i++) lines.push(rowWords(s, layer, head, i) + ".");
  if (s.nq > limit) lines.push(tr("({count} more {query} tokens not listed.)", { count: s.nq - limit, query: s.queryNoun }));
  return lines.join("\n");
}

// The keyboard's cell on the enlarged head: a frame drawn over it, its row and column labels marked, and what it
// holds said in the live region.
function showCursor(s) {
  const [i, j] = s.cursor;
  const { cell } = bigLayout(s.nq, s.nk, s.textScale);
  Object.assign(s.cursorBox.style, { display: "block", left: `${j * cell}px`, top: `${i * cell}px`, width: `${cell}px`, height: `${cell}px` });
  s.rowLabels.forEach((r, k) => r.classList.toggle("hs-hot", k === i));
  s.colLabels.forEach((c, k) => c.classList.toggle("hs-hot", k === j));
  s.live.textContent = `${hoverText(s, s.layer, s.head, i, j)}. ${rowWords(s, s.layer, s.head, i)}.`;
  s.root.dataset.cursor = `${i},${j}`;
}

// The words the view shows in the page's language: ``data.strings`` maps each English text (``{name}`` fields) to its
// translation (the app sends them for a page in Chinese; a file or a notebook sends none: English).
let STRINGS = {};
function tr(text, values = {}) {
  return (STRINGS[text] || text).replace(/\{(\w+)\}/g, (field, name) => (name in values ? String(values[name]) : field));
}

// The page's words for every view drawn after this (``data.strings``; none: English).
function useStrings(strings) {
  STRINGS = strings || {};
}

function selectHead(s, layer, head) {
  s.layer = layer;
  s.head = head;
  render(s);
  sendPick(s);
  s.live.textContent = tr("Layer {layer}, head {head} selected. Enter opens it; arrows then move between cells.", { layer, head });
}

// A PNG drawn here (nothing fetched): a title, then the enlarged head with its token labels, or the model
// view's tiles with their layer and head labels.
function savePng(s) {
  const out = document.createElement("canvas");
  const ctx = out.getContext("2d");
  let name;
  if (s.view === "model") {
    const g = s.modelGrid;
    const tile = Math.max(24, Math.min(120, Math.floor(1600 / g.cols))), gap = 6, left = 70, top = 50;
    const high = Math.max(2, Math.round((tile * s.nq) / s.nk)); // a cross-attention head keeps its shape
    out.width = left + g.cols * (tile + gap);
    out.height = top + g.rows * (high + gap);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, out.width, out.height);
    ctx.imageSmoothingEnabled = false;
    ctx.fillStyle = "#212529";
    ctx.font = "bold 14px sans-serif";
    ctx.fillText(g.title, 4, 18);
    ctx.font = "12px sans-serif";
    g.colNames.forEach((text, c) => ctx.fillText(text, left + c * (tile + gap), top - 8));
    g.rowNames.forEach((text, r) => ctx.fillText(text, 4, top + r * (high + gap) + high / 2));
    g.tiles.forEach(({ canvas, row, col }) => ctx.drawImage(canvas, left + col * (tile + gap), top + row * (high + gap), tile, high));
    name = "headscope-model-view.png";
  } else {
    const nq = s.nq, nk = s.nk;
    const cell = Math.max(6, Math.min(32, Math.floor(900 / Math.max(nq, nk))));
    const font = Math.max(8, Math.min(14, cell - 2));
    ctx.font = `${font}px sans-serif`;
    const margin = Math.ceil(Math.max(...s.tokens.concat(s.keyTokens).map((t) => ctx.measureText(t).width))) + 8;
    out.width = margin + nk * cell + 10;
    out.height = 30 + nq * cell + margin;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, out.width, out.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(s.bigCanvas, margin, 30, nk * cell, nq * cell);
    ctx.fillStyle = "#212529";
    ctx.font = "bold 14px sans-serif";
    ctx.fillText(tr("Layer {layer}, head {head}", { layer: s.layer, head: s.head }), 4, 18);
    ctx.font = `${font}px sans-serif`;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    s.tokens.forEach((token, i) => ctx.fillText(token, margin - 4, 30 + (i + 0.5) * cell));
    s.keyTokens.forEach((token, i) => {
      ctx.save();
      ctx.translate(margin + (i + 0.5) * cell, 30 + nq * cell + 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(token, 0, 0);
      ctx.restore();
    });
    name = `headscope-layer${s.layer}-head${s.head}.png`;
  }
  const link = document.createElement("a");
  link.download = name;
  link.href = out.toDataURL("image/png");
  link.click();
}

// The visitor's choice: the layer, head, view and shape of the server's data or of what is shown here.
function pickOf(source) {
  return { layer: source.layer, head: source.head, view: source.view, shape: source.shape };
}

function samePick(a, b) {
  return a.layer === b.layer && a.head === b.head && a.view === b.view && a.shape === b.shape;
}

// The visitor's choice goes back to the server in one state value: one rerun.
function sendPick(s) {
  s.pending = pickOf(s);
  s.setStateValue("pick", s.pending);
}

// A cell of the enlarged head picked (a click on it, or Enter on the keyboard's cell): the pick with the cell's
// query row and key column, numbered so that the same cell picked again is still a change the server sees; null
// for a cell the causal mask hides (it has no score).
function cellPick(s, i, j) {
  if (s.causal && j > i) return null;
  s.cellPicks = (s.cellPicks || 0) + 1;
  return { ...pickOf(s), query: i, key: j, n: s.cellPicks };
}

// Send a picked cell to the server (Explore opens its score decomposition); a saved file's setStateValue does
// nothing, so there the cell's weight in the live region is all a pick shows.
function pickCell(s, i, j) {
  const pick = cellPick(s, i, j);
  if (!pick) return null;
  s.pending = pickOf(s);
  s.setStateValue("pick", pick);
  return pick;
}

// A token's row label clicked (or Enter on it): the pick with the token's row, numbered as a cell's, so that the
// server shows the distribution a written token was drawn from or, when the data allows prompt tokens
// (``token_picks``), the model's distribution at the position before a prompt token; null for any other row.
function canPickToken(s, i) {
  return s.written.has(i) || (s.tokenPicks && i > 0 && i < s.nq);
}

function tokenPick(s, i) {
  if (!canPickToken(s, i)) return null;
  s.cellPicks = (s.cellPicks || 0) + 1;
  return { ...pickOf(s), token: i, n: s.cellPicks };
}

function pickToken(s, i) {
  const pick = tokenPick(s, i);
  if (!pick) return null;
  s.pending = pickOf(s);
  s.setStateValue("pick", pick);
  if (s.live) {
    s.live.textContent = tr('{query} {i} "{token}" picked: a distribution is shown below the view.', { query: s.queryNoun, i, token: s.tokens[i] });
  }
  return pick;
}

// A row of buttons, one per [value, label], that sets s[name] to its value, redraws here and tells the server.
function tabGroup(s, name, choices, label) {
  const group = el("div", "hs-tabs");
  group.setAttribute("role", "tablist");
  group.setAttribute("aria-label", label);
  group.buttons = {};
  choices.forEach(([value, text]) => {
    const tab = el("button", "hs-tab", text);
    tab.type = "button";
    tab.dataset[name] = value;
    tab.setAttribute("role", "tab");
    tab.addEventListener("click", () => {
      if (s[name] === value) return;
      s[name] = value;
      render(s);
      sendPick(s);
    });
    group.buttons[value] = tab;
    group.append(tab);
  });
  return group;
}

function build(root, s) {
  root.replaceChildren();
  s.tabs = tabGroup(s, "view", [["head", tr("Head view")], ["model", tr("Model view")]], tr("Attention view"));
  s.tabButtons = s.tabs.buttons;
  s.slider = el("input", "hs-slider");
  s.slider.type = "range";
  s.slider.min = "0";
  s.slider.step = "1";
  s.slider.setAttribute("aria-label", tr("Layer"));
  s.sliderValue = el("span", "hs-slider-value");
  const controls = el("label", "hs-controls");
  controls.append(el("span", "hs-slider-label", tr("Layer")), s.slider, s.sliderValue);
  s.gridTitle = el("div", "hs-title");
  s.grid = el("div", "hs-grid");
  s.status = el("div", "hs-status");
  s.bigTitle = el("div", "hs-big-title");
  const shapes = tabGroup(s, "shape", [["heatmap", tr("Heatmap")], ["lines", tr("Lines")]], tr("Show the selected head as"));
  s.shapeTabs = shapes.buttons;
  shapes.classList.add("hs-shapes");
  s.linesNote = el("span", "hs-note", tr("Its lines are drawn below."));
  const bigHead = el("div", "hs-big-head");
  bigHead.append(s.bigTitle, shapes, s.linesNote);
  s.pngButton = el("button", "hs-png", tr("PNG of this head"));
  s.pngButton.type = "button";
  s.pngButton.addEventListener("click", () => savePng(s));
  s.big = el("div", "hs-big");
  s.live = liveRegion("hs-live");
  s.words = el("div", "hs-sr-only hs-words");
  s.words.setAttribute("role", "note");
  s.words.setAttribute("aria-label", tr("The selected head in words"));
  s.headPane = el("div", "hs-head-pane");
  s.headPane.append(controls, s.gridTitle, s.grid, bigHead, s.big, s.live, s.words, s.pngButton);
  s.modelTitle = el("div", "hs-title");
  s.modelNote = el("div", "hs-note", tr("Every head of every layer at once. Click a head to open it in the head view."));
  s.model = el("div", "hs-model");
  s.modelBar = el("div", "hs-model-bar");
  const modelBody = el("div", "hs-model-body");
  modelBody.append(s.model, s.modelBar);
  s.modelPng = el("button", "hs-png", "PNG of the model view");
  s.modelPng.type = "button";
  s.modelPng.addEventListener("click", () => savePng(s));
  s.modelPane = el("div", "hs-model-pane");
  s.modelLive = liveRegion("hs-live");
  s.modelPane.append(s.modelTitle, s.modelNote, modelBody, s.modelLive, s.modelPng);
  s.tip = el("div", "hs-tip");
  root.append(s.tabs, s.status, s.headPane, s.modelPane, s.tip);

  s.slider.addEventListener("input", () => {
    s.layer = Number(s.slider.value);
    render(s);
  });
  s.slider.addEventListener("change", () => sendPick(s));
}

function layoutGrid(s) {
  s.grid.replaceChildren();
  s.tiles = [];
  for (let h = 0; h < s.heads; h++) {
    const tile = el("div", "hs-tile");
    tile.dataset.head = String(h);
    const label = el("div", "hs-label");
    const canvas = el("canvas", "hs-canvas");
    tile.append(label, canvas);
    tile.addEventListener("click", () => {
      s.head = h;
      render(s);
      sendPick(s);
    });
    // Keyboard: left/right the head before or after, up/down the layer before or after, Enter opens the head.
    asButton(tile, tr("Layer {layer} head {head}", { layer: s.layer, head: h }), () => {
      selectHead(s, s.layer, h);
      if (s.shape === "heatmap") s.bigCanvas.focus();
    });
    tile.addEventListener("keydown", (event) => {
      const to = moveCursor(s.layer, h, event.key, s.layers, s.heads);
      if (!to || event.key === "Home" || event.key === "End" || event.key.startsWith("Page")) return;
      event.preventDefault();
      selectHead(s, to[0], to[1]);
      s.tiles[to[1]].tile.focus();
    });
    canvas.addEventListener("mousemove", (event) => {
      const cell = cellAt(canvas, s, event);
      showTip(s, event, cell && tr("layer {layer} head {head}: {cell}", { layer: s.layer, head: h, cell: hoverText(s, s.layer, h, cell[0], cell[1]) }));
    });
    canvas.addEventListener("mouseleave", () => showTip(s, null, null));
    s.grid.append(tile);
    s.tiles.push({ tile, label, canvas });
  }
}

function showTip(s, event, text) {
  if (!text) {
    s.tip.style.display = "none";
    return;
  }
  s.tip.textContent = text;
  s.tip.style.display = "block";
  s.tip.style.left = `${event.clientX + 14}px`;
  s.tip.style.top = `${event.clientY + 14}px`;
}

// The enlarged head: the heatmap with token labels on both axes (rows: queries, columns: keys) and a
// colour bar. Built once per sentence; repainted per head.
// The enlarged head's size (nq query rows, nk key columns; n = the longer side): up to 96 tokens with their
// labels, cells of 9 to 28 px in about 560 px; longer inputs without labels, cells of at least 3 px in about
// 640 px; label font from the cell and the text scale. Cells are square, so a cross-attention head of 2 target
// tokens by 21 source tokens is drawn 21 cells wide and 2 high; its colour bar is 0.6 of the side, at most the
// plot's height and at least 100 px (readable ticks).
function bigLayout(nq, nk, textScale) {
  const n = Math.max(nq, nk);
  const labelled = n <= 96;
  const cell = labelled ? Math.min(28, Math.max(9, Math.floor(560 / n))) : Math.max(3, Math.floor(640 / n));
  const font = Math.round(Math.max(7, Math.min(12, cell - 2)) * textScale);
  const side = cell * nk;
  const height = cell * nq;
  return { labelled, cell, side, height, font, bar: Math.max(100, Math.min(Math.round(0.6 * side), height)) };
}

function layoutBig(s) {
  s.big.replaceChildren();
  const { labelled, cell, side, height, font, bar: barHeight } = bigLayout(s.nq, s.nk, s.textScale);
  s.big.style.setProperty("--hs-side", `${side}px`);
  s.big.style.setProperty("--hs-height", `${height}px`);
  s.big.style.setProperty("--hs-cell", `${cell}px`);
  s.big.style.setProperty("--hs-font", `${font}px`);
  s.big.style.setProperty("--hs-bar-height", `${barHeight}px`);

  const yTitle = el("div", "hs-axis-title hs-y-title", tr(s.cross ? "target token (attending)" : "query (attending)"));
  const rows = el("div", "hs-rows");
  const plot = el("div", "hs-plot");
  s.bigCanvas = el("canvas", "hs-big-canvas");
  plot.append(s.bigCanvas);
  if (s.boundary !== null) {
    const v = el("div", "hs-boundary hs-boundary-v");
    v.style.left = `${s.boundary * cell}px`;
    const h = el("div", "hs-boundary hs-boundary-h");
    h.style.top = `${s.boundary * cell}px`;
    v.style.borderColor = h.style.borderColor = s.segmentColor;
    plot.append(v, h);
  }
  if (s.causal) {
    const clip = maskPolygon(Array.from({ length: s.nq }, (_, i) => i + 1), s.nk, cell, cell);
    if (clip) {
      const hatch = el("div", "hs-mask-hatch");
      Object.assign(hatch.style, { width: `${side}px`, height: `${height}px`, clipPath: clip });
      plot.append(hatch);
    }
  }
  s.cursorBox = el("div", "hs-cursor");
  plot.append(s.cursorBox);
  s.bigCanvas.tabIndex = 0;
  s.bigCanvas.setAttribute("role", "application");
  s.bigCanvas.setAttribute("aria-roledescription", tr("attention heatmap"));
  s.bigCanvas.setAttribute(
    "aria-label",
    tr(
      "The selected head, {rows} {query} rows by {cols} {key} columns: arrow keys move between cells, " +
        "Enter reads the row's top tokens and picks the cell, Escape goes back to the heads.",
      { rows: s.nq, query: s.queryNoun, cols: s.nk, key: s.keyNoun },
    ),
  );
  s.bigCanvas.addEventListener("focus", () => {
    if (!s.cursor) s.cursor = [0, 0];
    showCursor(s);
  });
  s.bigCanvas.addEventListener("blur", () => {
    s.cursorBox.style.display = "none";
  });
  s.bigCanvas.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      s.tiles[s.head].tile.focus();
      return;
    }
    if (event.key === "Enter") {
      event.preventDefault();
      s.live.textContent = `${rowWords(s, s.layer, s.head, s.cursor[0], 5)}.`;
      pickCell(s, s.cursor[0], s.cursor[1]);
      return;
    }
    const to = moveCursor(s.cursor[0], s.cursor[1], event.key, s.nq, s.nk);
    if (!to) return;
    event.preventDefault();
    s.cursor = to;
    showCursor(s);
  });
  const cols = el("div", "hs-cols");
  const xTitle = el("div", "hs-axis-title hs-x-title", tr(s.cross ? "source token (attended to)" : "key (attended to)"));
  s.rowLabels = [];
  s.colLabels = [];
  if (labelled) {
    s.tokens.forEach((token, i) => {
      const r = el("span", "hs-row-label", token);
      r.title = `${s.queryNoun} ${i}: ${token}`;
      if (s.written.has(i)) {
        // A token the model wrote: marked, and a click (or Enter) shows the distribution it was drawn from.
        r.classList.add("hs-written");
        r.title += tr(" (written by the model: click for the distribution it was drawn from)");
        asButton(r, tr("Written token {i}, {token}: show the distribution it was drawn from", { i, token }), () => pickToken(s, i));
        r.addEventListener("click", () => pickToken(s, i));
      } else if (canPickToken(s, i)) {
        // A prompt token: a click shows what the model predicted at the position before it.
        r.classList.add("hs-pickable");
        r.title += tr(" (click for the model's prediction at the position before it)");
        asButton(r, tr("Token {i}, {token}: show the model's prediction before it", { i, token }), () => pickToken(s, i));
        r.addEventListener("click", () => pickToken(s, i));
      }
      rows.append(r);
      s.rowLabels.push(r);
    });
    s.keyTokens.forEach((token, j) => {
      const c = el("span", "hs-col-label", token);
      c.title = `${s.keyNoun} ${j}: ${token}`;
      cols.append(c);
      s.colLabels.push(c);
    });
  }
  const bar = colorBar(s.lut, tr("weight"));

  const body = el("div", "hs-big-body");
  body.append(yTitle, rows, plot, bar, el("div"), el("div"), cols, el("div"), el("div"), el("div"), xTitle);
  s.big.append(body);
  s.bigCanvas.addEventListener("mousemove", (event) => {
    const c = cellAt(s.bigCanvas, s, event);
    showTip(s, event, c && hoverText(s, s.layer, s.head, c[0], c[1]));
    s.rowLabels.forEach((r, i) => r.classList.toggle("hs-hot", !!c && i === c[0]));
    s.colLabels.forEach((k, j) => k.classList.toggle("hs-hot", !!c && j === c[1]));
  });
  // A click picks the cell under the pointer: framed as the keyboard's cell, its weight said, sent to the server.
  s.bigCanvas.addEventListener("click", (event) => {
    const c = cellAt(s.bigCanvas, s, event);
    if (!c) return;
    s.cursor = c;
    showCursor(s);
    pickCell(s, c[0], c[1]);
  });
  s.bigCanvas.addEventListener("mouseleave", () => {
    showTip(s, null, null);
    s.rowLabels.concat(s.colLabels).forEach((x) => x.classList.remove("hs-hot"));
  });
}

// The model view: one small canvas a head, layers as rows (as columns when a model has more layers than
// heads, e.g. SmolLM2's 30 x 9, so the grid is wider than tall). Built once per sentence.
// The model view's grid: a row per layer and a column per head, or a column per layer when there are more
// layers than heads (so the grid is wider than tall); tiles of 22 to 96 px in about 900 px.
function modelLayout(layers, heads) {
  const across = layers > heads;
  const rows = across ? heads : layers;
  const cols = across ? layers : heads;
  const tile = Math.max(22, Math.min(96, Math.floor(900 / cols) - 6));
  const rowNames = Array.from({ length: rows }, (_, r) => (across ? tr("head {head}", { head: r }) : tr("layer {layer}", { layer: r })));
  const colNames = Array.from({ length: cols }, (_, c) => (across ? `L${c}` : tr("head {head}", { head: c })));
  return { across, rows, cols, tile, rowNames, colNames };
}

function layoutModel(s) {
  s.model.replaceChildren();
  const { across, rows, cols, tile, rowNames, colNames } = modelLayout(s.layers, s.heads);
  s.model.style.gridTemplateColumns = `auto repeat(${cols}, ${tile}px)`;
  // Column labels as large as the text scale asks, but never wider than their tile (SmolLM2's "L29" over a
  // 24 px tile at 1.6 x text was cut to "L2"): the largest font whose widest label, measured, fits.
  const measure = document.createElement("canvas").getContext("2d");
  let colFont = Math.round(11 * s.textScale);
  for (; colFont > 8; colFont--) {
    measure.font = `${colFont}px sans-serif`;
    if (Math.max(...colNames.map((text) => measure.measureText(text).width)) <= tile - 2) break;
  }
  s.model.style.setProperty("--hs-model-col-font", `${colFont}px`);
  const tiles = [];
  s.model.append(el("div"));
  colNames.forEach((text) => s.model.append(el("div", "hs-model-col", text)));
  for (let r = 0; r < rows; r++) {
    s.model.append(el("div", "hs-model-row", rowNames[r]));
    for (let c = 0; c < cols; c++) {
      const layer = across ? c : r;
      const head = across ? r : c;
      const canvas = el("canvas", "hs-model-canvas");
      canvas.dataset.layer = String(layer);
      canvas.dataset.head = String(head);
      canvas.title = "";
      canvas.addEventListener("mousemove", (event) => {
        const cell = cellAt(canvas, s, event);
        const where = cell && tr("layer {layer} head {head}: {cell}", { layer, head, cell: hoverText(s, layer, head, cell[0], cell[1]) });
        showTip(s, event, cell && `${where}\n${tr("click to open it in the head view")}`);
      });
      canvas.addEventListener("mouseleave", () => showTip(s, null, null));
      const open = () => {
        s.layer = layer;
        s.head = head;
        s.view = "head";
        render(s);
        sendPick(s);
      };
      canvas.addEventListener("click", open);
      // Keyboard: arrows move between the tiles as they are laid out, Enter opens the head in the head view.
      asButton(canvas, tr("Layer {layer} head {head}: Enter opens it in the head view", { layer, head }), () => {
        open();
        s.tiles[head].tile.focus();
      });
      canvas.addEventListener("keydown", (event) => {
        const to = moveCursor(r, c, event.key, rows, cols);
        if (!to || event.key === "Home" || event.key === "End" || event.key.startsWith("Page")) return;
        event.preventDefault();
        const next = tiles.find((t) => t.row === to[0] && t.col === to[1]);
        next.canvas.focus();
        s.live.textContent = tr("Layer {layer}, head {head}.", { layer: next.layer, head: next.head });
        s.modelLive.textContent = s.live.textContent;
      });
      s.model.append(canvas);
      tiles.push({ canvas, row: r, col: c, layer, head });
    }
  }
  const title = tr("All {layers} layers x {heads} heads", { layers: s.layers, heads: s.heads });
  s.modelGrid = { rows, cols, rowNames, colNames, tiles, title };
  const bar = colorBar(s.lut, tr("weight"));
  const tileHeight = (tile * s.nq) / s.nk;
  bar.style.setProperty("--hs-bar-height", `${Math.max(100, Math.round(0.6 * Math.min(420, rows * (tileHeight + 6))))}px`);
  s.modelBar.replaceChildren(bar);
}

// What a draw shows: the sentence's data, the layers sent, the view, the layer, the head, the enlarged head or not.
function shownKey(s) {
  return `${s.sig}:${s.sent}:${s.view}:${s.layer}:${s.head}:${s.shape}`;
}

function drawHead(root, s) {
  s.slider.value = String(s.layer);
  s.sliderValue.textContent = `${s.layer}`;
  s.gridTitle.textContent = tr("Layer {layer}: all {heads} heads", { layer: s.layer, heads: s.heads });
  s.bigTitle.textContent = tr("Layer {layer}, head {head}", { layer: s.layer, head: s.head });
  const enlarged = s.shape === "heatmap";
  markActive(s.shapeTabs, s.shape);
  s.linesNote.style.display = enlarged ? "none" : "";
  s.big.style.display = enlarged ? "" : "none";
  s.pngButton.style.display = enlarged ? "" : "none";
  if (!s.layerIndex.has(s.layer) || !s.headReady) {
    // Only one layer was sent (a long input), or the model view's first tokens: the server sends the rest.
    s.status.textContent = tr("Loading layer {layer}...", { layer: s.layer });
    s.grid.style.visibility = s.big.style.visibility = "hidden";
    return;
  }
  s.grid.style.visibility = s.big.style.visibility = "";
  s.tiles.forEach(({ tile, label, canvas }, h) => {
    label.textContent = `L${s.layer} H${h}`;
    tile.classList.toggle("hs-selected", h === s.head);
    tile.setAttribute("aria-label", tr("Layer {layer} head {head}", { layer: s.layer, head: h }));
    tile.setAttribute("aria-pressed", String(h === s.head));
    paint(canvas, s, s.layer, h);
  });
  if (enlarged) paint(s.bigCanvas, s, s.layer, s.head);
  s.words.textContent = headWords(s, s.layer, s.head);
  if (s.cursor && document.activeElement === s.bigCanvas) showCursor(s);
  root.dataset.layer = String(s.layer);
  root.dataset.head = String(s.head);
  root.dataset.painted = String(s.tiles.length + (enlarged ? 1 : 0));
  root.dataset.drawn = `${s.sig}:${s.layer}:${s.head}`;
}

function drawModel(root, s) {
  s.modelTitle.textContent = s.modelGrid.title;
  if (!s.modelReady) {
    // The head view of a long input holds one layer: the server sends every layer for the model view.
    s.status.textContent = tr("Loading every layer...");
    s.model.style.visibility = "hidden";
    return;
  }
  s.model.style.visibility = "";
  s.modelGrid.tiles.forEach(({ canvas, layer, head }) => paint(canvas, s, layer, head));
  root.dataset.painted = String(s.modelGrid.tiles.length);
  root.dataset.drawn = `${s.sig}:model`;
}

function markActive(buttons, value) {
  Object.entries(buttons).forEach(([key, tab]) => {
    tab.classList.toggle("hs-active", key === value);
    tab.setAttribute("aria-selected", String(key === value));
  });
}

function draw(root, s) {
  showTip(s, null, null);
  root.dataset.view = s.view;
  root.dataset.drawn = "";
  s.status.textContent = "";
  markActive(s.tabButtons, s.view);
  s.headPane.style.display = s.view === "head" ? "" : "none";
  s.modelPane.style.display = s.view === "model" ? "" : "none";
  if (s.view === "model") drawModel(root, s);
  else drawHead(root, s);
}

// Redraw after a switch made here, unless nothing shown changed.
function render(s) {
  const shown = shownKey(s);
  if (shown !== s.shown) draw(s.root, s);
  s.shown = shown;
}

export default function (component) {
  const { data, parentElement, setStateValue } = component;
  const root = parentElement.querySelector(".hs-headview");
  if (!root || !data) return;
  const s = root.__headscope || { root, sig: null, pending: null };
  root.__headscope = s;
  s.setStateValue = setStateValue;
  useStrings(data.strings);
  const language = JSON.stringify(STRINGS);
  if (!s.slider || s.language !== language) {
    build(root, s); // its words in the page's language: built again when the language changes
    s.language = language;
    s.sig = null;
    s.shown = null;
  }

  const sent = data.layers_sent.join(",");
  const newSentence = s.sig !== data.sig;
  if (newSentence || s.sent !== sent) {
    s.bytes = decodeBytes(data.weights);
    s.layerIndex = new Map(data.layers_sent.map((layer, index) => [layer, index]));
    s.sent = sent;
  }
  // Presentation mode switched on or off: the same sentence, every text at the new scale.
  const rescaled = s.textScale !== data.text_scale;
  if (rescaled) {
    s.textScale = data.text_scale;
    root.style.setProperty("--hs-scale", String(s.textScale));
  }
  if (newSentence) {
    s.sig = data.sig;
    s.tokens = data.tokens;
    s.cross = Array.isArray(data.key_tokens);
    s.keyTokens = s.cross ? data.key_tokens : data.tokens;
    s.queryNoun = tr(s.cross ? "target" : "query");
    s.keyNoun = tr(s.cross ? "source" : "key");
    s.nq = s.tokens.length;
    s.nk = s.keyTokens.length;
    s.layers = data.num_layers;
    s.heads = data.num_heads;
    s.levels = data.levels;
    s.causal = data.causal;
    s.boundary = data.boundary;
    s.written = new Set(data.written || []); // rows of tokens the model wrote: their labels are buttons
    s.tokenPicks = !!data.token_picks; // and every other row's after the first (a decoder that writes)
    const palette = paletteOf(data);
    s.segmentColor = palette.segment;
    s.lut = palette.lut;
    s.masked = palette.masked;
    root.style.setProperty("--hs-aspect", `${s.nk} / ${s.nq}`); // cells stay square: a head is nk wide, nq high
    s.pending = null;
    s.cursor = null;
    s.slider.max = String(data.num_layers - 1);
    s.slider.disabled = data.num_layers < 2;
    root.dataset.tokens = JSON.stringify(data.tokens);
    root.dataset.keyTokens = JSON.stringify(s.keyTokens);
    root.dataset.sig = data.sig;
    layoutGrid(s);
    layoutBig(s);
    layoutModel(s);
  } else if (rescaled) {
    layoutBig(s); // its token labels' font size is computed from the scale
  }
  // What this data can show without the server: the view it was sent for, and the other one when
  // ``switchable`` (every layer sent, the same tokens for both views).
  const allLayers = data.layers_sent.length === data.num_layers;
  s.headReady = data.view === "head" || data.switchable;
  s.modelReady = allLayers && (data.view === "model" || data.switchable);
  // The server's choice wins, unless the visitor switched here and the server has not caught up yet.
  const p = s.pending;
  if (!p || samePick(p, data)) {
    s.pending = null;
    Object.assign(s, pickOf(data));
  }
  // A rerun that changes nothing shown (e.g. the one that puts a switch made here into the link) repaints nothing.
  if (newSentence || rescaled) s.shown = null;
  render(s);
}

export { bigLayout, cellIndex, cellPick, headPixels, headWords, modelLayout, pickCell, pickOf, pickToken, rowWords, samePick, tokenPick, useStrings, weight };
