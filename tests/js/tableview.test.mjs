// Unit tests of the head table view's pure parts (mha_core/views/assets/tableview/tableview.js): run by
// `node --test tests/js/`. The numbers are worked out by hand here.
import assert from "node:assert/strict";
import { test } from "node:test";

import { cellAt, scaleOf, valueRange } from "../../mha_core/views/assets/tableview/tableview.js";

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
