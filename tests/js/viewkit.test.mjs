// Unit tests of the view kit (ui/viewkit/viewkit.js), which every view drawn in the browser imports: run by
// `node --test tests/js/` (scripts/test.sh). The numbers are worked out by hand here, independently of the code.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  LEVELS,
  colorOf,
  decodeBytes,
  decodeFloats,
  hexRgb,
  largest,
  levelOf,
  lookupTable,
  paletteOf,
  setLevel,
  setRgb,
  shortNumber,
  tickValues,
  unscaled,
} from "../../mha_core/views/assets/viewkit/viewkit.js";

const GREY = [
  [0, "#ffffff"],
  [1, "#000000"],
];

test("decodeBytes gives back the bytes packed in base64", () => {
  assert.deepEqual([...decodeBytes(Buffer.from([0, 1, 127, 128, 255]).toString("base64"))], [0, 1, 127, 128, 255]);
  assert.deepEqual([...decodeBytes("")], []);
});

test("decodeFloats gives back little-endian float32 values exactly", () => {
  const values = [0, 0.0014, 0.390625, 1, 1e-7];
  const buffer = Buffer.alloc(values.length * 4);
  values.forEach((v, k) => buffer.writeFloatLE(v, k * 4));
  assert.deepEqual([...decodeFloats(buffer.toString("base64"))], values.map((v) => Math.fround(v)));
});

test("the colour scale interpolates between its stops byte by byte", () => {
  const grey = lookupTable(GREY);
  assert.equal(grey.length, 256 * 3);
  assert.deepEqual([...grey.slice(0, 3)], [255, 255, 255]);
  assert.deepEqual([...grey.slice(255 * 3)], [0, 0, 0]);
  assert.deepEqual([...grey.slice(51 * 3, 51 * 3 + 3)], [204, 204, 204]); // t = 0.2: 255 * 0.8
  const three = lookupTable([
    [0, "#ff0000"],
    [0.5, "#00ff00"],
    [1, "#0000ff"],
  ]);
  assert.deepEqual([...three.slice(0, 3)], [255, 0, 0]);
  assert.deepEqual([...three.slice(51 * 3, 51 * 3 + 3)], [153, 102, 0]); // t = 0.2: 0.4 of the way to green
  assert.deepEqual([...three.slice(204 * 3, 204 * 3 + 3)], [0, 102, 153]); // t = 0.8: 0.6 of the way to blue
  assert.deepEqual(hexRgb("#1f77b4"), [31, 119, 180]);
});

test("a value's step is round(value * stretch * 255), clamped; its colour is that step's", () => {
  assert.equal(LEVELS, 255);
  assert.equal(levelOf(0), 0);
  assert.equal(levelOf(1), 255);
  assert.equal(levelOf(0.5), 128); // 127.5 rounds up
  assert.equal(levelOf(0.0014), 0); // 0.357 of a step: white, as on every view of the weights
  assert.equal(levelOf(0.0014, 1 / 0.0014), 255); // stretched to its own size: the darkest
  assert.equal(levelOf(2), 255);
  assert.equal(levelOf(-0.1), 0);
  assert.equal(levelOf(NaN), 0);
  const grey = lookupTable(GREY);
  assert.deepEqual(colorOf(grey, 0.2), [204, 204, 204]); // step 51
  assert.deepEqual(colorOf(grey, 0.1, 2), [204, 204, 204]); // 0.1 stretched twice is 0.2
  const px = new Uint8ClampedArray(8);
  setLevel(px, 0, grey, 51);
  setRgb(px, 4, [1, 2, 3]);
  assert.deepEqual([...px], [204, 204, 204, 255, 1, 2, 3, 255]);
});

test("the palette the server sends is ready to paint with", () => {
  const palette = paletteOf({ colorscale: GREY, masked_color: "#e9ecef", segment_color: "#e8590c" });
  assert.deepEqual([...palette.lut.slice(0, 3)], [255, 255, 255]);
  assert.deepEqual(palette.masked, [233, 236, 239]);
  assert.equal(palette.segment, "#e8590c");
});

test("images scaled to their own largest value come back as byte / 255 * top", () => {
  const values = unscaled(Uint8Array.from([9, 255, 0, 51]), 1, 3, 0.02);
  assert.deepEqual([...values], [0.02, 0, 0.004].map((v) => Math.fround(v)));
  assert.equal(largest(values), Math.fround(0.02));
  assert.equal(largest([]), 0);
});

test("the colour bar's ticks are weights, from its top (1, or a stretched view's largest value) down to 0", () => {
  assert.deepEqual(tickValues(), [1, 0.75, 0.5, 0.25, 0]);
  assert.deepEqual(tickValues(0.0016).map(shortNumber), ["0.0016", "0.0012", "0.0008", "0.0004", "0"]);
  assert.equal(shortNumber(0.390123), "0.39");
  assert.equal(shortNumber(1), "1");
  assert.equal(shortNumber(0.00142857), "0.00143");
});
