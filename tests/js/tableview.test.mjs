// Unit tests of the head table view's pure parts (mha_core/views/assets/tableview/tableview.js): run by
// `node --test tests/js/`. The numbers are worked out by hand here.
import assert from "node:assert/strict";
import { test } from "node:test";

import { cellAt, detailText, labelWords, scaleOf, valueRange } from "../../mha_core/views/assets/tableview/tableview.js";
import { translator } from "../../mha_core/views/assets/viewkit/viewkit.js";

test("the colour scale runs from min(0, smallest) to the largest finite value", () => {
  assert.deepEqual(valueRange([0.2, NaN, 0.9, 0.5]), [0, 0.9]);
  assert.deepEqual(valueRange([-2, 3, Infinity]), [-2, 3]);
  assert.deepEqual(valueRange([NaN, NaN]), [0, 1]); // nothing finite: a range that is not empty
  assert.deepEqual(valueRange([0, 0]), [0, 1]);
});

test("a column with values below zero is coloured on the signed scale, symmetric about zero", () => {
  assert.deepEqual(scaleOf([0.2, NaN, 0.9]), { signed: false, lo: 0, hi: 0.9 });
  assert.deepEqual(scaleOf([-2, 0.5, NaN]), { signed: true, lo: -2, hi: 2 }); // white at 0: the middle of the scale
  assert.deepEqual(scaleOf([-0.25, 1.5]), { signed: true, lo: -1.5, hi: 1.5 });
  assert.deepEqual(scaleOf([-3, -1]), { signed: true, lo: -3, hi: 3 });
});

test("a point falls in the cell under it, layers down and heads across", () => {
  const box = { left: 10, top: 20, width: 120, height: 60 }; // 3 layers x 4 heads: cells 30 wide, 20 high
  assert.deepEqual(cellAt(box, 3, 4, 10, 20), [0, 0]);
  assert.deepEqual(cellAt(box, 3, 4, 129, 79), [2, 3]);
  assert.deepEqual(cellAt(box, 3, 4, 71, 41), [1, 2]);
  assert.equal(cellAt(box, 3, 4, 131, 30), null);
  assert.equal(cellAt(box, 3, 4, 50, 19), null);
});

test("the view's own words are English unless its data sends them in another language", () => {
  const english = translator(undefined);
  assert.deepEqual(labelWords(english), { column: "Column ", columnShown: "Column shown", heads: "head →", layers: "layer ↓" });
  assert.equal(detailText(english, 2, 5, ["score 0.5"]), "Layer 2, head 5\nscore 0.5");
  assert.equal(detailText(english, 0, 1, []), "Layer 0, head 1\n(no row)");
  const strings = {
    "Column ": "列 ",
    "Column shown": "显示的列",
    "head →": "头 →",
    "layer ↓": "层 ↓",
    "Layer {layer}, head {head}": "第 {layer} 层，第 {head} 个头",
    "(no row)": "（没有行）",
  };
  const chinese = translator(strings);
  assert.deepEqual(labelWords(chinese), { column: "列 ", columnShown: "显示的列", heads: "头 →", layers: "层 ↓" });
  assert.equal(detailText(chinese, 2, 5, ["score 0.5"]), "第 2 层，第 5 个头\nscore 0.5"); // the table's rows: its own
  assert.equal(detailText(chinese, 0, 1, []), "第 0 层，第 1 个头\n（没有行）");
  // Fields are filled once: a value that looks like a field stays as it is; a text without an entry stays English.
  assert.equal(translator({ "{column} (blue < 0 < red)": "{column}（蓝 < 0 < 红）" })("{column} (blue < 0 < red)", { column: "{head}" }), "{head}（蓝 < 0 < 红）");
  assert.equal(chinese("no entry {n}", { n: 3 }), "no entry 3");
});
