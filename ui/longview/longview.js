// Headscope's deep-zoom view of a long run (ui/longview/__init__.py). The head view: every head of a layer as an
// overview, and one head's region zoomed (exact values pooled from exact blocks, mean or max, down to single
// tokens with their labels). Drag on the zoomed head to zoom into a rectangle; the arrows pan, "Zoom out" doubles
// the region, a click on a small head shows that head whole. Each gesture goes back to the server as component
// state ("zoom"), which answers with that region pooled from exact blocks. The model view: every head of every
// layer at overview level. Tokens are user text: they only go into textContent or canvas pixels, never HTML.
// After painting, the root gets data-drawn="<sig>:<layer>:<head>:<r0>-<r1>:<c0>-<c1>:<reduce>" (head view) or
// "<sig>:model:<reduce>"; data-values holds the zoomed cells' values (row-major), for tests.

const STOPS = ["#ffffff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"];
const MASKED = [226, 226, 226];

function lookupTable() {
  const rgb = STOPS.map((hex) => [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16)));
  const table = new Uint8ClampedArray(256 * 3);
  for (let b = 0; b < 256; b++) {
    const t = (b / 255) * (rgb.length - 1);
    const k = Math.min(Math.floor(t), rgb.length - 2);
    const f = t - k;
    for (let c = 0; c < 3; c++) table[b * 3 + c] = Math.round(rgb[k][c] + f * (rgb[k + 1][c] - rgb[k][c]));
  }
  return table;
}
const LUT = lookupTable();

function decodeBytes(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

function decodeFloats(base64) {
  const bytes = decodeBytes(base64);
  return new Float32Array(bytes.buffer, 0, bytes.length / 4);
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// One image of bytes (0..255, already scaled to its own largest value) painted into a size x size canvas.
function paintBytes(canvas, bytes, offset, size) {
  canvas.width = size;
  canvas.height = size;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(size, size);
  const px = image.data;
  for (let k = 0; k < size * size; k++) {
    const b = bytes[offset + k] * 3;
    px[k * 4] = LUT[b];
    px[k * 4 + 1] = LUT[b + 1];
    px[k * 4 + 2] = LUT[b + 2];
    px[k * 4 + 3] = 255;
  }
  ctx.putImageData(image, 0, 0);
}

// The zoomed region's float values, coloured against their largest value; a decoder's cells wholly above the
// diagonal (keys after every query of the cell) are grey.
function paintValues(canvas, s) {
  const rows = s.rowEdges.length - 1;
  const cols = s.colEdges.length - 1;
  canvas.width = cols;
  canvas.height = rows;
  let top = 0;
  for (const v of s.values) top = Math.max(top, v);
  s.top = top;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(cols, rows);
  const px = image.data;
  for (let a = 0; a < rows; a++) {
    for (let b = 0; b < cols; b++) {
      const p = (a * cols + b) * 4;
      const hidden = s.causal && s.colEdges[b] > s.rowEdges[a + 1] - 1;
      if (hidden) {
        px[p] = MASKED[0];
        px[p + 1] = MASKED[1];
        px[p + 2] = MASKED[2];
      } else {
        const level = top > 0 ? Math.round((s.values[a * cols + b] / top) * 255) * 3 : 0;
        px[p] = LUT[level];
        px[p + 1] = LUT[level + 1];
        px[p + 2] = LUT[level + 2];
      }
      px[p + 3] = 255;
    }
  }
  ctx.putImageData(image, 0, 0);
}

function send(s, zoom) {
  s.pending = zoom;
  s.root.classList.add("hs-lv-busy");
  s.status.textContent = "Pooling the exact weights of that region...";
  s.setStateValue("zoom", zoom);
}

function clampRegion(s, r0, r1, c0, c1) {
  const n = s.n;
  const fit = (lo, hi) => {
    let width = Math.max(1, Math.min(hi - lo, n));
    lo = Math.max(0, Math.min(lo, n - width));
    return [lo, lo + width];
  };
  [r0, r1] = fit(r0, r1);
  [c0, c1] = fit(c0, c1);
  return { layer: s.layer, head: s.head, r0, r1, c0, c1, reduce: s.reduce, view: s.view };
}

function pan(s, rowsBy, colsBy) {
  const [r0, r1, c0, c1] = s.region;
  const dr = Math.round((r1 - r0) * rowsBy);
  const dc = Math.round((c1 - c0) * colsBy);
  send(s, clampRegion(s, r0 + dr, r1 + dr, c0 + dc, c1 + dc));
}

function zoomOut(s) {
  const [r0, r1, c0, c1] = s.region;
  const hr = r1 - r0;
  const hc = c1 - c0;
  send(s, clampRegion(s, r0 - Math.ceil(hr / 2), r1 + Math.ceil(hr / 2), c0 - Math.ceil(hc / 2), c1 + Math.ceil(hc / 2)));
}

// Canvas pixel -> cell index along one axis.
function cellAt(edgesCount, pixel, extent) {
  return Math.min(edgesCount - 2, Math.max(0, Math.floor((pixel / extent) * (edgesCount - 1))));
}

function build(root, s) {
  root.replaceChildren();
  const bar = el("div", "hs-lv-bar");
  const button = (label, title, action, cls) => {
    const b = el("button", "hs-lv-button" + (cls ? " " + cls : ""), label);
    b.type = "button";
    b.title = title;
    b.addEventListener("click", action);
    bar.appendChild(b);
    return b;
  };
  s.viewButton = button("Model view", "Every head of every layer at overview level", () =>
    send(s, { ...clampRegion(s, ...s.region), view: s.view === "head" ? "model" : "head" }),
  );
  s.reduceButton = button("Max", "Pool each cell by its largest weight instead of the mean", () =>
    send(s, { ...clampRegion(s, ...s.region), reduce: s.reduce === "mean" ? "max" : "mean" }),
  );
  s.layerDown = button("Layer -", "The layer before", () =>
    send(s, { ...clampRegion(s, ...s.region), layer: Math.max(0, s.layer - 1) }),
  );
  s.layerUp = button("Layer +", "The next layer", () =>
    send(s, { ...clampRegion(s, ...s.region), layer: Math.min(s.layers - 1, s.layer + 1) }),
  );
  s.panButtons = [
    button("\u2190", "Pan to earlier keys", () => pan(s, 0, -0.5), "hs-lv-pan-left"),
    button("\u2192", "Pan to later keys", () => pan(s, 0, 0.5), "hs-lv-pan-right"),
    button("\u2191", "Pan to earlier queries", () => pan(s, -0.5, 0), "hs-lv-pan-up"),
    button("\u2193", "Pan to later queries", () => pan(s, 0.5, 0), "hs-lv-pan-down"),
    button("Zoom out", "Twice the region", () => zoomOut(s), "hs-lv-zoom-out"),
    button("Whole head", "The whole head", () => send(s, clampRegion(s, 0, s.n, 0, s.n)), "hs-lv-whole"),
  ];
  root.appendChild(bar);
  s.title = el("div", "hs-lv-title");
  root.appendChild(s.title);
  s.status = el("div", "hs-lv-status");
  root.appendChild(s.status);

  s.headPanel = el("div", "hs-lv-headview");
  s.grid = el("div", "hs-lv-grid");
  s.headPanel.appendChild(s.grid);
  const zoomBox = el("div", "hs-lv-zoombox");
  s.colLabels = el("div", "hs-lv-collabels");
  s.rowLabels = el("div", "hs-lv-rowlabels");
  s.stage = el("div", "hs-lv-stage");
  s.big = el("canvas", "hs-lv-big");
  s.rect = el("div", "hs-lv-rect");
  s.stage.append(s.big, s.rect);
  const middle = el("div", "hs-lv-middle");
  middle.append(s.rowLabels, s.stage);
  zoomBox.append(s.colLabels, middle);
  s.readout = el("div", "hs-lv-readout", " ");
  s.legend = el("div", "hs-lv-legend");
  zoomBox.append(s.readout, s.legend);
  s.headPanel.appendChild(zoomBox);
  root.appendChild(s.headPanel);
  s.modelPanel = el("div", "hs-lv-model");
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
    send(s, clampRegion(s, s.rowEdges[a0], s.rowEdges[a1 + 1], s.colEdges[b0], s.colEdges[b1 + 1]));
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
  if (s.tokenLevel) {
    s.readout.textContent =
      `query ${s.rowEdges[a]} "${s.rowTokens[a]}" -> key ${s.colEdges[b]} "${s.colTokens[b]}": ` + value.toPrecision(4);
  } else {
    s.readout.textContent = `queries ${span(s.rowEdges, a)}, keys ${span(s.colEdges, b)}: ${s.reduce} ${value.toPrecision(4)}`;
  }
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

function renderHead(s, data) {
  s.headPanel.style.display = "";
  s.modelPanel.style.display = "none";
  const size = data.grid_size;
  const bytes = decodeBytes(data.grid);
  s.grid.replaceChildren();
  for (let h = 0; h < data.num_heads; h++) {
    const cell = el("div", "hs-lv-thumb" + (h === data.head ? " hs-lv-selected" : ""));
    const canvas = el("canvas", "hs-lv-thumbcanvas");
    paintBytes(canvas, bytes, h * size * size, size);
    cell.append(canvas, el("div", "hs-lv-thumblabel", `head ${h}`));
    cell.title = `Layer ${data.layer}, head ${h}: the whole head (largest cell ${data.grid_tops[h].toPrecision(3)})`;
    cell.addEventListener("click", () => send(s, { ...clampRegion(s, 0, s.n, 0, s.n), head: h }));
    s.grid.appendChild(cell);
  }
  s.values = decodeFloats(data.values);
  s.rowEdges = data.row_edges;
  s.colEdges = data.col_edges;
  s.tokenLevel = data.token_level;
  s.rowTokens = data.row_tokens;
  s.colTokens = data.col_tokens;
  paintValues(s.big, s);
  drawLabels(s);
  const [r0, r1, c0, c1] = data.region;
  const rowsPerCell = Math.ceil((r1 - r0) / (s.rowEdges.length - 1));
  const colsPerCell = Math.ceil((c1 - c0) / (s.colEdges.length - 1));
  s.title.textContent = `Layer ${data.layer}, head ${data.head}: queries ${r0}-${r1 - 1}, keys ${c0}-${c1 - 1} of ${data.n} tokens`;
  s.legend.textContent = s.tokenLevel
    ? `Single tokens: each cell is one exact weight. Colour: white 0 to dark blue ${s.top.toPrecision(3)}, this view's largest weight.`
    : `Each cell: the ${data.reduce} of the exact weights of up to ${rowsPerCell} x ${colsPerCell} tokens. ` +
      `Colour: white 0 to dark blue ${s.top.toPrecision(3)}, this view's largest cell. Drag to zoom.`;
  s.root.dataset.values = JSON.stringify(Array.from(s.values, (v) => Number(v.toPrecision(8))));
  s.root.dataset.region = JSON.stringify(data.region);
  s.root.dataset.drawn = `${data.sig}:${data.layer}:${data.head}:${r0}-${r1}:${c0}-${c1}:${data.reduce}`;
}

function renderModel(s, data) {
  s.headPanel.style.display = "none";
  s.modelPanel.style.display = "";
  const size = data.grid_size;
  const bytes = decodeBytes(data.grid);
  s.modelPanel.replaceChildren();
  s.modelPanel.style.setProperty("--hs-lv-heads", String(data.num_heads));
  for (let layer = 0; layer < data.num_layers; layer++) {
    s.modelPanel.appendChild(el("div", "hs-lv-modellabel", `L${layer}`));
    for (let h = 0; h < data.num_heads; h++) {
      const k = layer * data.num_heads + h;
      const canvas = el("canvas", "hs-lv-modelcanvas");
      paintBytes(canvas, bytes, k * size * size, size);
      canvas.title = `Layer ${layer}, head ${h} (largest cell ${data.grid_tops[k].toPrecision(3)}): click to zoom`;
      canvas.addEventListener("click", () =>
        send(s, { layer, head: h, r0: 0, r1: s.n, c0: 0, c1: s.n, reduce: s.reduce, view: "head" }),
      );
      s.modelPanel.appendChild(canvas);
    }
  }
  s.title.textContent = `Every head at overview level (${data.reduce} of exact weights, ${size} x ${size} cells, each head coloured against its own largest cell); click a head to zoom`;
  s.root.dataset.drawn = `${data.sig}:model:${data.reduce}`;
}

export default function (component) {
  const { data, parentElement, setStateValue } = component;
  const root = parentElement.querySelector(".hs-longview");
  if (!root || !data) return;
  const s = root.__longview || { root, pending: null };
  root.__longview = s;
  s.setStateValue = setStateValue;
  if (!s.bar) {
    build(root, s);
    s.bar = true;
  }
  s.n = data.n;
  s.layers = data.num_layers;
  s.layer = data.layer;
  s.head = data.head;
  s.reduce = data.reduce;
  s.view = data.view;
  s.region = data.region;
  s.causal = Boolean(data.causal);
  s.pending = null;
  root.classList.remove("hs-lv-busy");
  s.status.textContent = "";
  s.viewButton.textContent = data.view === "head" ? "Model view" : "Head view";
  s.reduceButton.textContent = data.reduce === "mean" ? "Max pooling" : "Mean pooling";
  s.layerDown.disabled = data.view !== "head" || data.layer === 0;
  s.layerUp.disabled = data.view !== "head" || data.layer === data.num_layers - 1;
  for (const b of s.panButtons) b.disabled = data.view !== "head";
  root.style.setProperty("--hs-scale", String(data.text_scale || 1));
  if (data.view === "model") renderModel(s, data);
  else renderHead(s, data);
}
