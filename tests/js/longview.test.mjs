// Unit tests of the long-document view's pure parts (ui/longview/longview.js): run by `node --test tests/js/`.
// The numbers are worked out by hand here, independently of the code under test.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  cellAt,
  fitRegion,
  hiddenCell,
  legendText,
  panned,
  stretchOf,
  valuePixels,
  zoomedOut,
} from "../../mha_core/views/assets/longview/longview.js";
import { lookupTable, translator } from "../../mha_core/views/assets/viewkit/viewkit.js";

const PALETTE = {
  lut: lookupTable([
    [0, "#ffffff"],
    [1, "#000000"],
  ]),
  masked: [233, 236, 239],
};

test("a weight is painted on the weights' scale: 0.0014 is white at token level, not the darkest colour", () => {
  // Two rows of single tokens (edges 10..12) by three keys (20..23): weights 0.0014, 0.2, 1 / 0.5, 0, 0.25.
  const values = Float32Array.from([0.0014, 0.2, 1, 0.5, 0, 0.25]);
  const px = valuePixels(values, [10, 11, 12], [20, 21, 22, 23], false, PALETTE, stretchOf("absolute", 1));
  const grey = (k) => px[k * 4];
  assert.deepEqual([0, 1, 2, 3, 4, 5].map(grey), [255, 204, 0, 127, 255, 191]); // 255 - round(w * 255)
  assert.equal(px[3], 255); // opaque
});

test("stretched colours multiply every value by 1 / the image's largest, and only then", () => {
  assert.equal(stretchOf("absolute", 0.0014), 1);
  assert.equal(stretchOf("stretched", 0.0014), 1 / 0.0014);
  assert.equal(stretchOf("stretched", 0), 1); // an empty image stays as it is
  const tiny = valuePixels(Float32Array.from([0.0014]), [0, 1], [5, 6], false, PALETTE, stretchOf("stretched", 0.0014));
  assert.equal(tiny[0], 0); // the largest value is the darkest colour
  const values = Float32Array.from([0.25, 0.05, 0]);
  const px = valuePixels(values, [0, 1], [5, 6, 7, 8], false, PALETTE, stretchOf("stretched", 0.25));
  assert.deepEqual([px[0], px[4], px[8]], [0, 204, 255]); // 0.05 x 4 = 0.2: step 51
});

test("a decoder's cells wholly above the diagonal are the masked colour", () => {
  // Cells of two tokens: rows 0-1 and 2-3, keys 0-1 and 2-3. The cell [0, 1] (queries 0-1, keys 2-3) is hidden;
  // [1, 0] and the diagonal cells are not (query 1 sees key 1, query 3 sees key 2).
  const edges = [0, 2, 4];
  assert.equal(hiddenCell(edges, edges, 0, 1), true);
  assert.equal(hiddenCell(edges, edges, 0, 0), false);
  assert.equal(hiddenCell(edges, edges, 1, 0), false);
  assert.equal(hiddenCell(edges, edges, 1, 1), false);
  const px = valuePixels(Float32Array.from([1, 0, 0.5, 0.5]), edges, edges, true, PALETTE, 1);
  assert.deepEqual([...px.slice(4, 8)], [233, 236, 239, 255]);
  assert.deepEqual([...px.slice(0, 4)], [0, 0, 0, 255]);
  const open = valuePixels(Float32Array.from([1, 0, 0.5, 0.5]), edges, edges, false, PALETTE, 1);
  assert.deepEqual([...open.slice(4, 8)], [255, 255, 255, 255]); // an encoder: weight 0 is white
});

test("regions stay inside the document, pan by half a region and zoom out twice as wide", () => {
  assert.deepEqual(fitRegion(512, -10, 54, 500, 600), [0, 64, 412, 512]);
  assert.deepEqual(fitRegion(512, 0, 9999, 3, 3), [0, 512, 3, 4]);
  assert.deepEqual(panned(512, [400, 464, 360, 424], 0, 0.5), [400, 464, 392, 456]);
  assert.deepEqual(panned(512, [480, 512, 0, 32], 0.5, -0.5), [480, 512, 0, 32]); // already at the ends
  assert.deepEqual(zoomedOut(512, [100, 164, 90, 150]), [68, 196, 60, 180]);
  assert.deepEqual(zoomedOut(512, [0, 400, 0, 400]), [0, 512, 0, 512]);
  assert.equal(cellAt(129, 0, 512), 0);
  assert.equal(cellAt(129, 511.9, 512), 127);
  assert.equal(cellAt(129, 600, 512), 127);
});

test("the legend says which pooling, and whether and how much the colours are stretched", () => {
  const pooled = { tokenLevel: false, reduce: "max", rowsPerCell: 9, colsPerCell: 9 };
  assert.equal(
    legendText({ ...pooled, colour: "absolute", top: 0.8 }),
    "Each cell: the max of the exact weights of up to 9 x 9 tokens. Colours: the weights' one scale, as in the " +
      "head view (white 0, dark blue 1). Drag to zoom.",
  );
  const stretched = legendText({ tokenLevel: true, reduce: "max", colour: "stretched", top: 0.0014 });
  assert.ok(stretched.startsWith("Single tokens: each cell is one exact weight. Colours stretched x714:"), stretched);
  assert.ok(stretched.includes("the darkest is 0.0014, this view's largest weight, not 1"), stretched);
});

test("the legend is said in the page's language when the view is sent its words", () => {
  // The words the app sends (ui/locales/zh.json through ui/longview.VIEW_TEXTS): each text's fields filled after it
  // is translated, the pooling's name translated too, the numbers as they are.
  const tr = translator({
    "Each cell: the {reduce} of the exact weights of up to {rows} x {cols} tokens.":
      "每个格子：至多 {rows} x {cols} 个 token 的精确权重的{reduce}。",
    max: "最大值",
    " Colours: the weights' one scale, as in the head view (white 0, dark blue 1).": " 颜色：权重的统一色阶，与头视图相同（白色 0，深蓝 1）。",
    " Drag to zoom.": " 拖动即可放大。",
  });
  const pooled = { tokenLevel: false, reduce: "max", rowsPerCell: 9, colsPerCell: 4, colour: "absolute", top: 0.8 };
  assert.equal(
    legendText(pooled, tr),
    "每个格子：至多 9 x 4 个 token 的精确权重的最大值。 颜色：权重的统一色阶，与头视图相同（白色 0，深蓝 1）。 拖动即可放大。",
  );
  // A text the words do not hold stays English (the default: no words, the script's own).
  const stretched = legendText({ ...pooled, tokenLevel: true, colour: "stretched", top: 0.5 }, tr);
  assert.ok(stretched.startsWith("Single tokens: each cell is one exact weight. Colours stretched x2:"), stretched);
});
