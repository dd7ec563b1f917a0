// Unit tests of the head view's pure parts (ui/headview/headview.js): run by `node --test tests/js/`
// (scripts/test.sh). The numbers are worked out by hand here, independently of the code under test.
import assert from "node:assert/strict";
import { test } from "node:test";

import { bigLayout, cellIndex, cellPick, headPixels, modelLayout, pickCell, pickOf, pickToken, samePick, tokenPick, weight } from "../../mha_core/views/assets/headview/headview.js";
import { decodeBytes as decode, hexRgb, lookupTable } from "../../mha_core/views/assets/viewkit/viewkit.js";

// What ui/headview.pack sends: round(w * 255) per weight, [layers sent, heads, n, n] in C order, base64.
function packed(weights) {
  const bytes = Uint8Array.from(weights.flat(3).map((w) => Math.round(w * 255)));
  return Buffer.from(bytes).toString("base64");
}

// Two heads of one layer over three tokens, only layer 4 of the model sent (a long input's head view).
const HEAD0 = [
  [1, 0, 0],
  [0.5, 0.5, 0],
  [0.2, 0.3, 0.5],
];
const HEAD1 = [
  [0, 0, 1],
  [0, 1, 0],
  [1, 0, 0],
];

function sentence(causal = false) {
  const bytes = decode(packed([[HEAD0, HEAD1]]));
  return {
    bytes,
    nq: 3,
    nk: 3,
    heads: 2,
    levels: 255,
    causal,
    layerIndex: new Map([[4, 0]]),
    lut: lookupTable([
      [0, "#ffffff"],
      [1, "#000000"],
    ]),
    masked: hexRgb("#d0d0d0"),
    tokens: ["a", "b", "c"],
  };
}

test("weight unpacks a head's weight from the layers sent, to within half a level", () => {
  const s = sentence();
  assert.equal(weight(s, 4, 0, 0, 0), 1);
  assert.equal(weight(s, 4, 0, 1, 0), 128 / 255); // 0.5 * 255 = 127.5 rounds to 128
  assert.equal(weight(s, 4, 1, 0, 2), 1);
  assert.equal(weight(s, 4, 1, 0, 0), 0);
  for (const [head, grid] of [HEAD0, HEAD1].entries()) {
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 3; j++) assert.ok(Math.abs(weight(s, 4, head, i, j) - grid[i][j]) <= 0.5 / 255);
    }
  }
});

test("a head's pixels take the colour of each weight, and the masked colour above a causal diagonal", () => {
  const px = headPixels(sentence(), 4, 0);
  assert.equal(px.length, 3 * 3 * 4);
  assert.deepEqual([...px.slice(0, 4)], [0, 0, 0, 255]); // weight 1: black
  assert.deepEqual([...px.slice(4, 8)], [255, 255, 255, 255]); // weight 0: white
  assert.deepEqual([...px.slice(3 * 4, 3 * 4 + 4)], [127, 127, 127, 255]); // byte 128: 255 - 128
  const causal = headPixels(sentence(true), 4, 1);
  assert.deepEqual([...causal.slice(2 * 4, 2 * 4 + 4)], [208, 208, 208, 255]); // [0, 2] is above the diagonal
  assert.deepEqual([...causal.slice(6 * 4, 6 * 4 + 4)], [0, 0, 0, 255]); // [2, 0] weight 1, below it
});

test("the enlarged head's layout labels up to 96 tokens and fits the rest in about 640 px", () => {
  // The colour bar: 0.6 of the side (168 = 0.6 * 280).
  assert.deepEqual(bigLayout(10, 10, 1), { labelled: true, cell: 28, side: 280, height: 280, font: 12, bar: 168 });
  assert.deepEqual(bigLayout(50, 50, 1.6), { labelled: true, cell: 11, side: 550, height: 550, font: 14, bar: 330 }); // 9 px * 1.6
  assert.deepEqual(bigLayout(96, 96, 1), { labelled: true, cell: 9, side: 864, height: 864, font: 7, bar: 518 });
  assert.deepEqual(bigLayout(200, 200, 1), { labelled: false, cell: 3, side: 600, height: 600, font: 7, bar: 360 });
  assert.deepEqual(bigLayout(512, 512, 1), { labelled: false, cell: 3, side: 1536, height: 1536, font: 7, bar: 922 });
});

test("the model view puts layers across when there are more layers than heads", () => {
  const minilm = modelLayout(6, 12);
  assert.equal(minilm.across, false);
  assert.deepEqual([minilm.rows, minilm.cols, minilm.tile], [6, 12, 69]); // floor(900 / 12) - 6
  assert.deepEqual(minilm.rowNames, ["layer 0", "layer 1", "layer 2", "layer 3", "layer 4", "layer 5"]);
  assert.equal(minilm.colNames[11], "head 11");
  const smollm2 = modelLayout(30, 9);
  assert.equal(smollm2.across, true);
  assert.deepEqual([smollm2.rows, smollm2.cols, smollm2.tile], [9, 30, 24]);
  assert.deepEqual([smollm2.rowNames[8], smollm2.colNames[29]], ["head 8", "L29"]);
  assert.equal(modelLayout(2, 2).tile, 96); // small models: the largest tile
  assert.equal(modelLayout(48, 16).tile, 22); // large ones: never below 22 px
});

test("a point over the enlarged head is the cell under it, or nothing outside", () => {
  const box = { left: 10, top: 20, width: 100, height: 100 };
  assert.deepEqual(cellIndex(box, 4, 4, 40, 100), [3, 1]);
  assert.deepEqual(cellIndex(box, 4, 4, 10, 20), [0, 0]);
  assert.equal(cellIndex(box, 4, 4, 110, 50), null); // the right edge belongs to the next cell, outside
  assert.equal(cellIndex(box, 4, 4, 9, 50), null);
  // Cross-attention: 2 target rows by 5 source columns in the same box.
  assert.deepEqual(cellIndex(box, 2, 5, 40, 100), [1, 1]); // x 30 of 100 -> column 1 of 5; y 80 -> row 1 of 2
  assert.deepEqual(cellIndex(box, 2, 5, 109, 20), [0, 4]);
  assert.equal(cellIndex(box, 2, 5, 60, 120), null);
});

test("the enlarged head of a cross view is nk cells wide and nq cells high", () => {
  // 4 target tokens by 20 source tokens: the cell comes from the longer side (560 / 20 = 28 px); the colour bar is
  // as high as the plot (112 px), not 0.6 of its width (336 px), which would leave the frame mostly empty.
  assert.deepEqual(bigLayout(4, 20, 1), { labelled: true, cell: 28, side: 560, height: 112, font: 12, bar: 112 });
  // 2 by 21: 26 px cells, 546 x 52 px; the bar keeps its least readable height, 100 px.
  assert.deepEqual(bigLayout(2, 21, 1), { labelled: true, cell: 26, side: 546, height: 52, font: 12, bar: 100 });
});

test("a pick holds the layer, head, view and shape only, and two picks agree on all four", () => {
  const data = { layer: 2, head: 3, view: "head", shape: "lines", tokens: ["x"], sig: "abc" };
  assert.deepEqual(pickOf(data), { layer: 2, head: 3, view: "head", shape: "lines" });
  assert.ok(samePick(pickOf(data), data));
  assert.ok(!samePick(pickOf(data), { ...data, head: 4 }));
  assert.ok(!samePick(pickOf(data), { ...data, view: "model" }));
  assert.ok(!samePick(pickOf(data), { ...data, shape: "heatmap" }));
});

test("a picked cell goes to the server as the pick with its query and key, numbered, and a masked cell not at all", () => {
  const sent = [];
  const s = { ...sentence(true), layer: 4, head: 1, view: "head", shape: "heatmap" };
  s.setStateValue = (name, value) => sent.push([name, value]);
  // The cell under a click on a 120 x 90 px canvas of 3 x 3 cells (40 px wide, 30 px high) at (10, 90):
  // x 70 - 10 = 60 -> column 1; y 170 - 90 = 80 -> row 2.
  const box = { left: 10, top: 90, width: 120, height: 90 };
  const [i, j] = cellIndex(box, 3, 3, 70, 170);
  assert.deepEqual([i, j], [2, 1]);
  assert.deepEqual(pickCell(s, i, j), { layer: 4, head: 1, view: "head", shape: "heatmap", query: 2, key: 1, n: 1 });
  assert.deepEqual(sent, [["pick", { layer: 4, head: 1, view: "head", shape: "heatmap", query: 2, key: 1, n: 1 }]]);
  // The pending pick the server has to catch up with is the head's, without the cell (the server's data has none).
  assert.deepEqual(s.pending, { layer: 4, head: 1, view: "head", shape: "heatmap" });
  assert.ok(samePick(s.pending, { layer: 4, head: 1, view: "head", shape: "heatmap", sig: "x" }));
  // The same cell again is a new value (the server sees a change and reopens it).
  assert.equal(pickCell(s, 2, 1).n, 2);
  assert.equal(sent.length, 2);
  assert.notDeepEqual(sent[0][1], sent[1][1]);
  // Above a causal diagonal: no score to split, nothing sent.
  assert.equal(cellPick(s, 0, 2), null);
  assert.equal(pickCell(s, 1, 2), null);
  assert.equal(sent.length, 2);
  // A saved file's setStateValue does nothing: a pick there throws nothing.
  const file = { ...sentence(false), layer: 4, head: 0, view: "head", shape: "heatmap", setStateValue() {} };
  assert.deepEqual(pickCell(file, 0, 2), { layer: 4, head: 0, view: "head", shape: "heatmap", query: 0, key: 2, n: 1 });
});

test("a written token's label goes to the server as the pick with its row, numbered; a prompt token's not at all", () => {
  const sent = [];
  const s = {
    ...sentence(true),
    tokens: ["The", "cat", "\u25b8sat"],
    queryNoun: "query",
    written: new Set([2]),
    layer: 4,
    head: 1,
    view: "head",
    shape: "heatmap",
    setStateValue: (name, value) => sent.push([name, value]),
  };
  assert.deepEqual(pickToken(s, 2), { layer: 4, head: 1, view: "head", shape: "heatmap", token: 2, n: 1 });
  assert.deepEqual(sent, [["pick", { layer: 4, head: 1, view: "head", shape: "heatmap", token: 2, n: 1 }]]);
  assert.deepEqual(s.pending, { layer: 4, head: 1, view: "head", shape: "heatmap" });
  // The same token again is a new value; a cell picked after it is numbered after it (one counter).
  assert.equal(pickToken(s, 2).n, 2);
  assert.equal(pickCell(s, 2, 0).n, 3);
  // A prompt token (not written) and a row outside the sentence: nothing sent.
  assert.equal(tokenPick(s, 1), null);
  assert.equal(pickToken(s, 0), null);
  assert.equal(pickToken(s, 7), null);
  assert.equal(sent.length, 3);
});

test("with token_picks, a prompt token's label after the first is picked too, never the first", () => {
  const sent = [];
  const s = {
    ...sentence(true),
    queryNoun: "query",
    written: new Set(),
    tokenPicks: true,
    layer: 0,
    head: 0,
    view: "head",
    shape: "heatmap",
    setStateValue: (name, value) => sent.push([name, value]),
  };
  assert.equal(tokenPick(s, 0), null); // the first token has no position before it
  assert.deepEqual(pickToken(s, 1), { layer: 0, head: 0, view: "head", shape: "heatmap", token: 1, n: 1 });
  assert.equal(pickToken(s, 3), null); // outside the three rows
  assert.deepEqual(sent, [["pick", { layer: 0, head: 0, view: "head", shape: "heatmap", token: 1, n: 1 }]]);
  s.tokenPicks = false; // an encoder's view: no token picks
  assert.equal(pickToken(s, 1), null);
});
