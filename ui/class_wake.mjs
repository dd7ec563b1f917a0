// The class's wake-up on a student's page (ui/follow.py, ui/class_http.py ClassWake): the page holds one request
// to the server's wake-up address open; the server answers it as soon as the class's version number rises above
// the one this screen has seen (the teacher moved, asked, revealed), and the page then asks for its class poll's
// run at once (a trigger of this component, drawn inside the poll's fragment), instead of at the poll timer's next
// tick. The run is one the browser asked for. A hidden tab holds no request (a browser has few connections to one
// server; the poll's timer keeps it with the class); an address that is no class's (404) ends the watch.

export const PACE_MS = 1000; // a request answered sooner than this with no news waits the rest before the next
export const RETRY_MS = 2000; // after a failed request (the server restarting, the network gone)
export const BUSY_MS = 5000; // after "too many wake-ups at once" (429)

// What to do with one answer: { stop } (no class here), else { wake: the version to ask a run for, or null;
// after: the version the next request names; pauseMs: how long to wait before it }.
export function nextStep(status, body, after, elapsedMs) {
  if (status === 404) return { stop: true };
  if (status === 429) return { wake: null, after, pauseMs: BUSY_MS };
  if (status !== 200 || !body || !Number.isInteger(body.version)) return { wake: null, after, pauseMs: RETRY_MS };
  if (body.version > after) return { wake: body.version, after: body.version, pauseMs: 0 };
  return { wake: null, after, pauseMs: Math.max(0, PACE_MS - elapsedMs) };
}

// The address of one request: the server's wake-up address with the version this screen has seen.
export function requestUrl(url, after) {
  return `${url}?after=${encodeURIComponent(String(after))}`;
}

function pause(s, ms) {
  return new Promise((resolve) => {
    s.resume = resolve;
    setTimeout(resolve, ms);
  });
}

async function watch(s) {
  while (!s.stopped && s.root.isConnected) {
    if (document.visibilityState === "hidden") {
      await pause(s, 60000); // visibilitychange resumes it
      continue;
    }
    const started = Date.now();
    s.abort = new AbortController();
    let status = 0;
    let body = null;
    try {
      const response = await fetch(requestUrl(s.url, s.after), {
        cache: "no-store",
        credentials: "same-origin",
        signal: s.abort.signal,
      });
      status = response.status;
      body = status === 200 ? await response.json() : null;
    } catch {
      status = 0; // aborted (hidden, unmounted) or failed: looked at again below
    }
    if (s.stopped) return;
    const step = nextStep(status, body, s.after, Date.now() - started);
    if (step.stop) {
      s.noClass = true;
      return;
    }
    s.after = Math.max(s.after, step.after);
    if (step.wake !== null) s.setTriggerValue("woke", step.wake);
    if (step.pauseMs) await pause(s, step.pauseMs);
  }
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  const root = parentElement.querySelector(".hs-classwake");
  if (!root || !data) return;
  const s = root.__classwake || { root, after: -1, stopped: false };
  root.__classwake = s;
  s.setTriggerValue = setTriggerValue;
  s.url = data.url;
  s.after = Math.max(s.after, data.after); // the server's run may have seen a newer version than this watch
  if (!s.running && !s.noClass) {
    s.running = true;
    s.onVisible = () => {
      if (document.visibilityState === "hidden") s.abort?.abort();
      else s.resume?.();
    };
    document.addEventListener("visibilitychange", s.onVisible);
    watch(s).finally(() => {
      s.running = false;
      document.removeEventListener("visibilitychange", s.onVisible);
    });
  }
  return () => {
    s.stopped = true;
    s.abort?.abort();
    s.resume?.();
  };
}
