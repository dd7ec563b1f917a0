// Unit tests of the class's wake-up on a student's page (ui/class_wake.mjs): run by `node --test tests/js/`.
// The page's fetch, document and timers are stand-ins written here.
import assert from "node:assert/strict";
import { test } from "node:test";

import wake, { BUSY_MS, PACE_MS, RETRY_MS, nextStep, requestUrl } from "../../ui/class_wake.mjs";

test("an answer above the seen version asks for a run and names the new version next", () => {
  assert.deepEqual(nextStep(200, { version: 8 }, 7, 30), { wake: 8, after: 8, pauseMs: 0 });
  assert.deepEqual(nextStep(200, { version: 7 }, 7, 25000), { wake: null, after: 7, pauseMs: 0 }); // the bound
  assert.deepEqual(nextStep(200, { version: 5 }, 7, 200), { wake: null, after: 7, pauseMs: PACE_MS - 200 });
});

test("no class, too many, and failures: stop, back off, retry", () => {
  assert.deepEqual(nextStep(404, null, 3, 5), { stop: true });
  assert.deepEqual(nextStep(429, null, 3, 5), { wake: null, after: 3, pauseMs: BUSY_MS });
  assert.deepEqual(nextStep(0, null, 3, 5), { wake: null, after: 3, pauseMs: RETRY_MS });
  assert.deepEqual(nextStep(200, { version: "9" }, 3, 5), { wake: null, after: 3, pauseMs: RETRY_MS });
  assert.equal(requestUrl("/base/_headscope/class/version", 12), "/base/_headscope/class/version?after=12");
});

test("the page asks for one run per rise and stops when it is taken off the page", async () => {
  const answers = [{ version: 4 }, { version: 6 }]; // then the server holds the request
  const asked = [];
  let hold;
  globalThis.document = { visibilityState: "visible", addEventListener() {}, removeEventListener() {} };
  globalThis.fetch = (url, options) => {
    asked.push(url);
    const body = answers.shift();
    if (body) return Promise.resolve({ status: 200, json: () => Promise.resolve(body) });
    return new Promise((_, reject) => {
      hold = reject;
      options.signal.addEventListener("abort", () => reject(new Error("aborted")));
    });
  };
  const root = { isConnected: true };
  const triggers = [];
  const component = {
    data: { after: 3, url: "/_headscope/class/version" },
    parentElement: { querySelector: () => root },
    setTriggerValue: (event, value) => triggers.push([event, value]),
  };
  const cleanup = wake(component);
  wake({ ...component }); // a rerun of the poll drew it again: still one watch
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.deepEqual(triggers, [
    ["woke", 4],
    ["woke", 6],
  ]);
  assert.deepEqual(asked, [
    "/_headscope/class/version?after=3",
    "/_headscope/class/version?after=4",
    "/_headscope/class/version?after=6",
  ]);
  assert.equal(typeof hold, "function");
  cleanup();
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(asked.length, 3); // taken off the page: no request after the held one
  assert.equal(root.__classwake.running, false);
});
