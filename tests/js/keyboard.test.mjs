// Keyboard and screen-reader logic of the views (ui/viewkit/viewkit.js, ui/headview/headview.js): where an arrow key
// moves, which keys a row puts the most on and how that is said in words, and the hatch over the masked cells. The
// expected values are worked out by hand here. Run by `node --test tests/js/` (scripts/test.sh).
import assert from "node:assert/strict";
import { test } from "node:test";

import { headWords, rowWords, useStrings } from "../../mha_core/views/assets/headview/headview.js";
import { decodeBytes, describeRow, maskPolygon, moveCursor, topKeys } from "../../mha_core/views/assets/viewkit/viewkit.js";

test("arrow keys move one cell and stop at the edges; Home/End and PageUp/PageDown jump", () => {
  assert.deepEqual(moveCursor(1, 1, "ArrowUp", 3, 4), [0, 1]);
  assert.deepEqual(moveCursor(0, 1, "ArrowUp", 3, 4), [0, 1]);
  assert.deepEqual(moveCursor(2, 3, "ArrowDown", 3, 4), [2, 3]);
  assert.deepEqual(moveCursor(2, 3, "ArrowRight", 3, 4), [2, 3]);
  assert.deepEqual(moveCursor(2, 3, "ArrowLeft", 3, 4), [2, 2]);
  assert.deepEqual(moveCursor(1, 2, "Home", 3, 4), [1, 0]);
  assert.deepEqual(moveCursor(1, 2, "End", 3, 4), [1, 3]);
  assert.deepEqual(moveCursor(1, 2, "PageUp", 3, 4), [0, 2]);
  assert.deepEqual(moveCursor(1, 2, "PageDown", 3, 4), [2, 2]);
  assert.equal(moveCursor(1, 2, "a", 3, 4), null);
});

test("a row's top keys: largest first, ties to the earlier key, hidden keys left out", () => {
  const row = [0.1, 0.4, 0.1, 0.4];
  const tokens = ["w", "x", "y", "z"];
  const tops = topKeys(4, (j) => row[j], tokens, 3);
  assert.deepEqual(
    tops.map((t) => [t.index, t.token]),
    [
      [1, "x"],
      [3, "z"],
      [0, "w"],
    ],
  );
  const visible = topKeys(4, (j) => row[j], tokens, 2, (j) => j < 3);
  assert.deepEqual(
    visible.map((t) => t.token),
    ["x", "w"],
  );
  assert.equal(
    describeRow("query", 2, "y", visible),
    'query 2 "y" attends most to "x" (0.40), "w" (0.10)',
  );
});

test("the masked cells' hatch is the staircase above the diagonal", () => {
  // 3 x 3 causal head, 10 px cells: row 0 hides columns 1-2, row 1 column 2, row 2 nothing.
  assert.equal(
    maskPolygon([1, 2, 3], 3, 10, 10),
    "polygon(10px 0px, 10px 10px, 20px 10px, 20px 20px, 30px 20px, 30px 30px, 30px 30px, 30px 0px)",
  );
  assert.equal(maskPolygon([3, 3], 3, 10, 10), null);
  assert.equal(maskPolygon([1], 2, 50, 100, "%"), "polygon(50% 0%, 50% 100%, 100% 100%, 100% 0%)");
});

// A head view's sentence as headview.js holds it: one layer (4) of two heads over three tokens.
function sentence(causal) {
  const heads = [
    [1, 0, 0, 0.5, 0.5, 0, 0.2, 0.3, 0.5],
    [0, 0, 1, 0, 1, 0, 1, 0, 0],
  ];
  const bytes = Buffer.from(Uint8Array.from(heads.flat().map((w) => Math.round(w * 255)))).toString("base64");
  return {
    bytes: decodeBytes(bytes),
    nq: 3,
    nk: 3,
    heads: 2,
    levels: 255,
    causal,
    layerIndex: new Map([[4, 0]]),
    tokens: ["a", "b", "c"],
    keyTokens: ["a", "b", "c"],
    queryNoun: "query",
    keyNoun: "key",
  };
}

test("a head in words: each query's top keys with their weights, masked keys never named", () => {
  const s = sentence(false);
  assert.equal(rowWords(s, 4, 0, 2), 'query 2 "c" attends most to "c" (0.50), "b" (0.30), "a" (0.20)');
  assert.equal(rowWords(s, 4, 1, 0, 1), 'query 0 "a" attends most to "c" (1.00)');
  const causal = sentence(true);
  // Query 1 of head 1 under a causal mask: keys 0 and 1 only ("c" is after it).
  assert.equal(rowWords(causal, 4, 1, 1), 'query 1 "b" attends most to "b" (1.00), "a" (0.00)');
  const words = headWords(s, 4, 0).split("\n");
  assert.equal(words.length, 4);
  assert.equal(words[0], "Layer 4, head 0: each query token and the key tokens it attends to most.");
  assert.equal(words[2], 'query 1 "b" attends most to "a" (0.50), "b" (0.50), "c" (0.00).');
});

test("a head in words in the page's language: the sentences the page sent, the tokens and weights as they are", () => {
  // The Chinese the app sends (ui/locales/zh.json, ui/headview.VIEW_TEXTS): the words change, the tokens do not.
  useStrings({
    '{noun} {i} "{token}" attends most to {tops}': '{noun} {i} "{token}" 关注最多的是 {tops}',
    "Layer {layer}, head {head}: each {query} token and the {key} tokens it attends to most.":
      "第 {layer} 层，头 {head}：每个{query} token，以及它关注最多的{key} token。",
    "({count} more {query} tokens not listed.)": "（另有 {count} 个{query} token 未列出。）",
  });
  try {
    const s = { ...sentence(false), queryNoun: "查询", keyNoun: "键" };
    assert.equal(rowWords(s, 4, 0, 2), '查询 2 "c" 关注最多的是 "c" (0.50), "b" (0.30), "a" (0.20)');
    const words = headWords(s, 4, 0, 2).split("\n");
    assert.deepEqual(words, [
      "第 4 层，头 0：每个查询 token，以及它关注最多的键 token。",
      '查询 0 "a" 关注最多的是 "a" (1.00), "b" (0.00), "c" (0.00).',
      '查询 1 "b" 关注最多的是 "a" (0.50), "b" (0.50), "c" (0.00).',
      "（另有 1 个查询 token 未列出。）",
    ]);
    // A token that looks like a field is the text's own: filled in once, never read as a field again.
    const odd = { ...s, tokens: ["{tops}", "b", "c"] };
    assert.equal(rowWords(odd, 4, 1, 0, 1), '查询 0 "{tops}" 关注最多的是 "c" (1.00)');
  } finally {
    useStrings({});
  }
  assert.equal(rowWords(sentence(false), 4, 1, 0, 1), 'query 0 "a" attends most to "c" (1.00)');
});
