// A run's page: its state and size, the operator's actions, its graph, the
// chosen stage, and the provenance of every artifact. It follows the run's
// event stream and reads the run again after each change, so what it shows
// moves without a reload.

import { ApiError, events, get, path, post } from "/ui/api.js";
import { draw, layout, model } from "/ui/graph.js";
import { artifactTable, stagePanel } from "/ui/stage.js";
import { badge, confirm, count, el, say, time } from "/ui/ui.js";

const STATES = ["succeeded", "running", "ready", "blocked", "awaiting", "mapping", "failed", "dead", "cancelled"];
/** Which stage is chosen when the operator has chosen none. */
const FIRST_LOOK = ["awaiting", "failed", "dead", "running", "ready"];

export function runPage(main, runId, app) {
  const view = { selected: null, expanded: new Set(), viewing: new Set(), data: null };
  const life = { stopped: false, stream: null, reading: false, again: false, retry: null, plugins: null, seen: null };

  const ctx = {
    runId,
    viewing: view.viewing,
    redraw: render,
    select(stage) {
      view.selected = stage;
      render();
    },
    fail: app.fail,
    async act(question, label, url, body) {
      if (!(await confirm(question, label))) return;
      try {
        await post(url, body);
        say(`${label}: done.`, "ok");
      } catch (e) {
        app.fail(e);
      }
      read();
    },
  };

  async function load() {
    const sub = (tail) => get(path.sub(runId, tail));
    // Read once a page; a failed read is not kept.
    life.plugins ??= get("/plugins").catch((e) => {
      life.plugins = null;
      throw e;
    });
    const [detail, attempts, artifacts, calls, graph, history, deliveries, plugins] = await Promise.all([
      get(path.run(runId)),
      sub("attempts"),
      sub("artifacts"),
      sub("model-calls"),
      sub("graph"),
      sub("history"),
      get(`/deliveries?${new URLSearchParams({ run: runId })}`),
      life.plugins,
    ]);
    const { stages, ...run } = detail;
    return { run, stages, attempts, artifacts, calls, graph, history, deliveries, plugins };
  }

  /** Reads the run again; changes that arrive meanwhile read it once more after. */
  async function read() {
    if (life.reading) {
      life.again = true;
      return;
    }
    life.reading = true;
    try {
      do {
        life.again = false;
        const data = await load();
        if (life.stopped) return;
        // Drawn again only if something changed: a redraw replaces the
        // elements under the operator's pointer.
        const seen = JSON.stringify(data);
        if (seen !== life.seen) {
          life.seen = seen;
          view.data = data;
          render();
        }
      } while (life.again);
      if (view.data.run.state === "running") follow();
    } catch (e) {
      if (life.stopped) return;
      if (e instanceof ApiError && e.status === 404) {
        stop();
        main.replaceChildren(
          el("section", { class: "panel" }, el("h1", {}, "No such run"), el("p", {}, e.message), el("a", { href: "/", "data-nav": true }, "← All runs")),
        );
        return;
      }
      app.fail(e);
    } finally {
      life.reading = false;
    }
  }

  /** Follows the event stream while the run runs; it ends when the run has finished. */
  async function follow() {
    if (life.stream || life.retry || life.stopped) return;
    const abort = new AbortController();
    life.stream = abort;
    app.live(true);
    try {
      for await (const _ of events(path.sub(runId, "events"), abort.signal)) read();
    } catch (e) {
      if (abort.signal.aborted) return;
      app.fail(e);
      // Try again in a while, not in a loop.
      life.retry = setTimeout(() => {
        life.retry = null;
        read();
      }, 3000);
    } finally {
      if (life.stream === abort) life.stream = null;
      app.live(false);
      if (!life.stopped && !life.retry && !abort.signal.aborted) read();
    }
  }

  function render() {
    const d = view.data;
    if (!d) return;
    if (!d.stages.some((s) => s.stage === view.selected)) view.selected = firstLook(d.stages);
    const scroller = main.querySelector(".graph-scroll");
    const scrolled = scroller ? [scroller.scrollLeft, scroller.scrollTop] : [0, 0];
    const m = model(d.stages, d.graph.edges, view.expanded);
    const picture = draw(m, layout(m), {
      selected: view.selected,
      expanded: view.expanded,
      onSelect: (stage) => {
        ctx.select(stage);
        main.querySelector(".panel.stage")?.scrollIntoView({ block: "nearest" });
      },
      onToggle: (map) => {
        if (view.expanded.has(map)) view.expanded.delete(map);
        else view.expanded.add(map);
        render();
      },
    });
    const graph = el("div", { class: "graph-scroll", tabindex: 0, "aria-label": "The graph; scroll to see all of it" }, picture);
    main.replaceChildren(
      header(d, ctx),
      el(
        "section",
        { class: "panel", "aria-labelledby": "graph-title" },
        el("div", { class: "panel-head" }, el("h2", { id: "graph-title" }, "Graph"), legend()),
        graph,
      ),
      el(
        "div",
        { class: "columns" },
        stagePanel(view.selected, d, ctx),
        el(
          "section",
          { class: "panel", "aria-labelledby": "provenance-title" },
          el("h2", { id: "provenance-title" }, "Provenance"),
          el(
            "p",
            { class: "muted" },
            "Every stored artifact, the attempt and plugin that made it, and each stage that read it: ✓ when it read the canonical digest.",
          ),
          artifactTable(d.artifacts, d, ctx),
        ),
      ),
    );
    [graph.scrollLeft, graph.scrollTop] = scrolled;
  }

  function stop() {
    life.stopped = true;
    life.stream?.abort();
    clearTimeout(life.retry);
  }

  main.replaceChildren(el("p", { class: "muted" }, "Loading the run…"));
  read();
  return { stop };
}

function firstLook(stages) {
  for (const state of FIRST_LOOK) {
    const found = stages.find((s) => s.state === state);
    if (found) return found.stage;
  }
  return stages[0]?.stage ?? null;
}

function header(d, ctx) {
  const { run, stages, history } = d;
  const by = {};
  for (const s of stages) by[s.state] = (by[s.state] ?? 0) + 1;
  const elements = stages.filter((s) => /\[\d+\]$/.test(s.stage)).length;
  const counts = STATES.filter((s) => by[s]).map((s) => el("span", { class: `count-chip state-${s}`, "data-count": s }, `${count.format(by[s])} ${s}`));
  const actions = [];
  if (run.state === "running") {
    actions.push(
      el("button", {
        type: "button",
        class: "danger",
        "data-action": "cancel",
        onclick: () => ctx.act(`Cancel run ${run.id}? Attempts in flight are fenced out and waiting stages never start.`, "Cancel run", path.sub(run.id, "cancel"), { by: "dashboard" }),
      }, "Cancel run"),
    );
  }
  if (run.state === "failed" || run.state === "cancelled") {
    actions.push(
      el("button", {
        type: "button",
        class: "primary",
        "data-action": "retry",
        onclick: () => ctx.act(`Retry run ${run.id} from the stages that did not succeed? Journaled model answers are replayed.`, "Retry run", path.sub(run.id, "retry"), { by: "dashboard" }),
      }, "Retry run"),
    );
  }
  return el(
    "section",
    { class: "run-head", "data-run": run.id, "data-run-state": run.state },
    el(
      "div",
      { class: "title" },
      el("h1", {}, "Run ", el("code", {}, run.id)),
      badge(run.state),
      el("div", { class: "actions" }, actions),
    ),
    el(
      "dl",
      { class: "facts inline" },
      el("dt", {}, "Pipeline"),
      el("dd", {}, el("a", { href: `/?${new URLSearchParams({ pipeline: run.pipeline })}`, "data-nav": true }, run.pipeline)),
      el("dt", {}, "Submitted"),
      el("dd", {}, time(run.created_at)),
      el("dt", {}, "Finished"),
      el("dd", {}, time(run.finished_at)),
      run.idempotency_key ? [el("dt", {}, "Idempotency key"), el("dd", {}, el("code", {}, run.idempotency_key))] : null,
    ),
    el(
      "p",
      { class: "size", "data-stages": stages.length },
      el(
        "span",
        {},
        el("strong", {}, `${count.format(stages.length)} stages`),
        elements ? ` (${count.format(elements)} of them map elements)` : "",
        ":",
      ),
      counts,
    ),
    history.length
      ? el(
          "ol",
          { class: "history", "aria-label": "What operators did to the run" },
          history.map((e) => el("li", { "data-kind": e.kind }, time(e.at), " ", e.detail)),
        )
      : null,
  );
}

function legend() {
  return el(
    "ul",
    { class: "legend", "aria-label": "Legend" },
    el("li", {}, el("span", { class: "swatch data" }), "reads an output"),
    el("li", {}, el("span", { class: "swatch after" }), "runs after (ordering only)"),
    el("li", {}, el("span", { class: "shape-gate" }), "approval gate"),
    el("li", {}, el("span", { class: "shape-map" }), "mapped stage"),
  );
}
