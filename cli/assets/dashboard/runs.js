// The runs list: newest first, a page at a time, filtered by state and
// pipeline, or found by id or idempotency key; read again every few
// seconds while the tab is visible, so states move by themselves. The
// filters live in the URL, so a filtered list can be shared.

import { ApiError, get, path } from "/ui/api.js";
import { badge, el, time } from "/ui/ui.js";

const EVERY_MS = 3000;
const PAGE = 25;

export function runsPage(main, app) {
  const url = new URLSearchParams(location.search);
  const filter = { state: url.get("state") ?? "", pipeline: url.get("pipeline") ?? "", q: url.get("q") ?? "" };
  // The cursors of the pages before this one, and this one's.
  const back = [];
  let cursor = null;
  let stopped = false;
  let timer = null;
  let shown = null;

  const table = el("div", { class: "runs-table", "aria-live": "polite" });
  const pager = el("nav", { class: "pager", "aria-label": "Pages" });

  const field = (label, input) => el("label", {}, el("span", {}, label), input);
  const state = el(
    "select",
    { name: "state" },
    ["", "running", "succeeded", "failed", "cancelled"].map((s) =>
      el("option", { value: s, selected: s === filter.state }, s || "any state"),
    ),
  );
  const pipeline = el("input", { name: "pipeline", value: filter.pipeline, placeholder: "any pipeline", autocomplete: "off" });
  const search = el("input", { name: "q", type: "search", value: filter.q, placeholder: "run id or idempotency key", autocomplete: "off" });
  const form = el(
    "form",
    {
      class: "filters",
      role: "search",
      "aria-label": "Find runs",
      onsubmit: (e) => {
        e.preventDefault();
        filter.state = state.value;
        filter.pipeline = pipeline.value.trim();
        filter.q = search.value.trim();
        const query = new URLSearchParams(Object.entries(filter).filter(([, v]) => v));
        history.replaceState({}, "", query.size ? `/?${query}` : "/");
        back.length = 0;
        cursor = null;
        read();
      },
    },
    field("State", state),
    field("Pipeline", pipeline),
    field("Search", search),
    el("button", { type: "submit", class: "primary" }, "Apply"),
  );

  async function page() {
    const query = { limit: PAGE };
    if (filter.state) query.state = filter.state;
    if (filter.pipeline) query.pipeline = filter.pipeline;
    if (!filter.q) {
      if (cursor) query.cursor = cursor;
      return get(path.runs(query));
    }
    // A search: the run with that id, and the run with that key.
    const [byKey, byId] = await Promise.all([
      get(path.runs({ ...query, key: filter.q })),
      get(path.run(filter.q)).catch((e) => {
        if (e instanceof ApiError && e.status === 404) return null;
        throw e;
      }),
    ]);
    const runs = byKey.runs;
    const matches = (r) => (!filter.state || r.state === filter.state) && (!filter.pipeline || r.pipeline === filter.pipeline);
    if (byId && matches(byId) && !runs.some((r) => r.id === byId.id)) runs.unshift(byId);
    return { runs, next_cursor: null };
  }

  async function read() {
    clearTimeout(timer);
    try {
      const result = await page();
      if (stopped) return;
      // Drawn again only if something changed (or the pages moved).
      const seen = JSON.stringify([result, back.length, filter]);
      if (seen !== shown) {
        shown = seen;
        show(result);
      }
    } catch (e) {
      if (!stopped) app.fail(e);
    }
    if (!stopped) timer = setTimeout(read, EVERY_MS);
  }

  function show({ runs, next_cursor }) {
    if (!runs.length) {
      table.replaceChildren(el("p", { class: "empty" }, filter.q ? `No run has the id or idempotency key “${filter.q}”.` : "No runs match."));
    } else {
      table.replaceChildren(
        el(
          "table",
          {},
          el("thead", {}, el("tr", {}, ["Run", "Pipeline", "State", "Submitted", "Finished", "Idempotency key"].map((h) => el("th", { scope: "col" }, h)))),
          el(
            "tbody",
            {},
            runs.map((r) =>
              el(
                "tr",
                { "data-run": r.id, "data-state": r.state },
                el("td", {}, el("a", { href: path.run(r.id), "data-nav": true }, el("code", {}, r.id))),
                el("td", {}, r.pipeline),
                el("td", {}, badge(r.state)),
                el("td", {}, time(r.created_at)),
                el("td", {}, time(r.finished_at)),
                el("td", {}, r.idempotency_key ? el("code", {}, r.idempotency_key) : el("span", { class: "muted" }, "—")),
              ),
            ),
          ),
        ),
      );
    }
    const turn = (label, enabled, go) => el("button", { type: "button", class: "quiet", disabled: !enabled, onclick: go }, label);
    pager.replaceChildren(
      turn("← Newer", back.length > 0, () => {
        cursor = back.pop();
        read();
      }),
      turn("Older →", Boolean(next_cursor), () => {
        back.push(cursor);
        cursor = next_cursor;
        read();
      }),
    );
  }

  main.replaceChildren(el("section", { class: "panel" }, el("h1", {}, "Runs"), form, table, pager));
  read();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
