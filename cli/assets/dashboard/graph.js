// A run's graph: its stages and stored edges, laid out in layers from left
// to right (each stage one layer after the last stage it waits for), and
// drawn as SVG. A mapped stage's elements are drawn inside it, counted by
// state, unless the operator expands it; a map of more than
// `EXPAND_UP_TO` elements only shows its counts.

import { byName, svg } from "/ui/ui.js";

const W = 172;
const H = 50;
const GAP_X = 56;
const GAP_Y = 14;
const PAD = 18;

/** The most elements a map draws one by one. */
export const EXPAND_UP_TO = 60;

/** `each[10]` → `{ base: "each", index: 10 }`. */
function elementOf(name) {
  const m = /^(.*)\[(\d+)\]$/.exec(name);
  return m ? { base: m[1], index: Number(m[2]) } : null;
}

/**
 * What to draw: one node per stage, elements folded into their map unless
 * it is in `expanded`, and the edges between what is drawn.
 */
export function model(stages, edges, expanded) {
  const mapped = new Set(stages.filter((s) => s.map).map((s) => s.stage));
  const groupOf = (name) => {
    const element = elementOf(name);
    return element && mapped.has(element.base) ? element.base : null;
  };
  const nodes = new Map();
  for (const job of stages) {
    const group = groupOf(job.stage);
    if (group && !expanded.has(group)) continue;
    const kind = group ? "element" : job.gate != null ? "gate" : job.map ? "map" : "stage";
    nodes.set(job.stage, { id: job.stage, job, kind, counts: {}, elements: 0 });
  }
  for (const job of stages) {
    const group = groupOf(job.stage);
    const node = group && nodes.get(group);
    if (!node) continue;
    node.counts[job.state] = (node.counts[job.state] ?? 0) + 1;
    node.elements += 1;
  }
  const drawn = (name) => (nodes.has(name) ? name : groupOf(name));
  const seen = new Set();
  const links = [];
  for (const edge of edges) {
    const from = drawn(edge.from_stage);
    const to = drawn(edge.to_stage);
    if (!from || !to || from === to || !nodes.has(from) || !nodes.has(to)) continue;
    const key = JSON.stringify([from, to, edge.kind]);
    if (seen.has(key)) continue;
    seen.add(key);
    links.push({ from, to, kind: edge.kind, satisfied: edge.satisfied });
  }
  return { nodes: [...nodes.values()], links };
}

/** Layers by longest path, ordered within by their predecessors' places. */
export function layout({ nodes, links }) {
  const preds = new Map(nodes.map((n) => [n.id, []]));
  const succs = new Map(nodes.map((n) => [n.id, []]));
  for (const link of links) {
    preds.get(link.to).push(link.from);
    succs.get(link.from).push(link.to);
  }
  const waiting = new Map(nodes.map((n) => [n.id, preds.get(n.id).length]));
  const layerOf = new Map();
  const queue = nodes.filter((n) => waiting.get(n.id) === 0).map((n) => n.id);
  for (const id of queue) layerOf.set(id, 0);
  for (let i = 0; i < queue.length; i++) {
    const from = queue[i];
    for (const to of succs.get(from)) {
      layerOf.set(to, Math.max(layerOf.get(to) ?? 0, layerOf.get(from) + 1));
      waiting.set(to, waiting.get(to) - 1);
      if (waiting.get(to) === 0) queue.push(to);
    }
  }
  const layers = [];
  for (const node of nodes) {
    // The store holds no cycle; anything unplaced is drawn first, not lost.
    (layers[layerOf.get(node.id) ?? 0] ??= []).push(node.id);
  }
  const place = new Map();
  const index = () => layers.forEach((layer) => layer.forEach((id, i) => place.set(id, i)));
  for (const layer of layers) layer.sort(byName);
  index();
  for (let sweep = 0; sweep < 2; sweep++) {
    for (const layer of layers.slice(1)) {
      const centre = new Map(
        layer.map((id) => {
          const p = preds.get(id).map((q) => place.get(q));
          return [id, p.length ? p.reduce((a, b) => a + b, 0) / p.length : place.get(id)];
        }),
      );
      layer.sort((a, b) => centre.get(a) - centre.get(b) || byName(a, b));
      index();
    }
  }
  const tallest = Math.max(1, ...layers.map((l) => l.length));
  const at = new Map();
  layers.forEach((layer, x) => {
    const offset = ((tallest - layer.length) * (H + GAP_Y)) / 2;
    layer.forEach((id, y) => {
      at.set(id, { x: PAD + x * (W + GAP_X), y: PAD + offset + y * (H + GAP_Y) });
    });
  });
  return {
    at,
    layers: layers.length,
    width: PAD * 2 + layers.length * (W + GAP_X) - GAP_X,
    height: PAD * 2 + tallest * (H + GAP_Y) - GAP_Y,
  };
}

const ORDER = ["succeeded", "running", "ready", "blocked", "awaiting", "mapping", "failed", "dead", "cancelled"];

function subtitle(node) {
  const job = node.job;
  if (node.kind === "gate") return `approval · ${job.state}`;
  if (node.kind === "map") {
    if (!node.elements) return `map · ${job.state}`;
    const parts = ORDER.filter((s) => node.counts[s]).map((s) => `${node.counts[s]} ${s}`);
    return `map of ${node.elements} · ${parts.join(", ")}`;
  }
  return `${job.state} · attempt ${job.attempt}/${job.max_attempts}`;
}

function clip(text, most) {
  return text.length > most ? `${text.slice(0, most - 1)}…` : text;
}

/**
 * The graph as an SVG element. `selected` is the chosen stage;
 * `onSelect(stage)` and `onToggle(map)` are called on click or Enter.
 */
export function draw(m, lay, { selected, expanded, onSelect, onToggle }) {
  const root = svg("svg", {
    class: "graph",
    width: lay.width,
    height: lay.height,
    viewBox: `0 0 ${lay.width} ${lay.height}`,
    role: "group",
    "aria-label": `The run's graph: ${m.nodes.length} nodes in ${lay.layers} layers`,
  });
  root.append(
    svg(
      "defs",
      {},
      svg(
        "marker",
        { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }),
      ),
    ),
  );
  for (const link of m.links) {
    const a = lay.at.get(link.from);
    const b = lay.at.get(link.to);
    const x1 = a.x + W;
    const y1 = a.y + H / 2;
    const x2 = b.x - 2;
    const y2 = b.y + H / 2;
    const bend = GAP_X / 2;
    root.append(
      svg("path", {
        class: `edge ${link.kind}${link.satisfied ? " satisfied" : ""}`,
        d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
        "marker-end": "url(#arrow)",
        "data-from": link.from,
        "data-to": link.to,
        "data-kind": link.kind,
      }),
    );
  }
  for (const node of m.nodes) {
    const { x, y } = lay.at.get(node.id);
    const activate = () => onSelect(node.id);
    const group = svg("g", {
      class: `node kind-${node.kind} state-${node.job.state}${node.id === selected ? " selected" : ""}`,
      transform: `translate(${x} ${y})`,
      role: "button",
      tabindex: 0,
      "aria-label": `${node.kind === "gate" ? "approval gate" : node.kind} ${node.id}: ${subtitle(node)}`,
      "aria-pressed": node.id === selected ? "true" : "false",
      "data-stage": node.id,
      "data-state": node.job.state,
      "data-kind": node.kind,
      onclick: activate,
      onkeydown: (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          activate();
        }
      },
    });
    group.append(svg("title", {}, `${node.id}\n${subtitle(node)}`));
    if (node.kind === "map") {
      group.append(svg("rect", { class: "stack", x: 6, y: -6, width: W, height: H, rx: 8 }));
      group.append(svg("rect", { class: "stack", x: 3, y: -3, width: W, height: H, rx: 8 }));
    }
    if (node.kind === "gate") {
      const n = 12;
      const points = [[n, 0], [W - n, 0], [W, H / 2], [W - n, H], [n, H], [0, H / 2]];
      group.append(svg("polygon", { class: "shape", points: points.map((p) => p.join(",")).join(" ") }));
    } else {
      group.append(svg("rect", { class: "shape", width: W, height: H, rx: 8 }));
    }
    group.append(svg("text", { class: "name", x: 12, y: 20 }, clip(node.id, 22)));
    group.append(svg("text", { class: "sub", x: 12, y: 38 }, clip(subtitle(node), 27)));
    root.append(group);
    if (node.kind === "map" && node.elements > 0 && node.elements <= EXPAND_UP_TO) {
      const open = expanded.has(node.id);
      const toggle = () => onToggle(node.id);
      root.append(
        svg(
          "g",
          {
            class: "toggle",
            transform: `translate(${x + W - 24} ${y + 4})`,
            role: "button",
            tabindex: 0,
            "aria-label": `${open ? "Fold" : "Show"} the ${node.elements} elements of ${node.id}`,
            "aria-expanded": open ? "true" : "false",
            onclick: (e) => {
              e.stopPropagation();
              toggle();
            },
            onkeydown: (e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                toggle();
              }
            },
          },
          svg("rect", { width: 20, height: 20, rx: 4 }),
          svg("text", { x: 10, y: 15, "text-anchor": "middle" }, open ? "−" : "+"),
        ),
      );
    }
  }
  return root;
}
