// One stage of a run as the operator reads it (its facts, its attempts on
// a timeline, its journal, its outputs and their deliveries), and the
// provenance of artifacts: who made each one, and whether each stage that
// read it read the canonical bytes.

import { bytes, path } from "/ui/api.js";
import { badge, byName, clock, count, digest, duration, el, time } from "/ui/ui.js";

/** `data`: what the run's page read (see run.js); `ctx`: its actions. */
export function stagePanel(name, data, ctx) {
  const job = data.stages.find((s) => s.stage === name);
  if (!job) return el("p", { class: "muted" }, `No stage ${name} in this run.`);
  const attempts = data.attempts.filter((a) => a.stage === name);
  const calls = data.calls.filter((c) => c.stage === name);
  const outputs = data.artifacts.filter((a) => a.stage === name);
  const deliveries = data.deliveries.filter((d) => d.stage === name);
  return el(
    "section",
    { class: "panel stage", "aria-labelledby": "stage-title", "data-stage": name },
    el("h2", { id: "stage-title" }, el("span", {}, name), " ", badge(job.state)),
    facts(job, data),
    job.gate != null && job.state === "awaiting" ? decision(name, ctx) : null,
    job.map ? mapElements(name, data, ctx) : null,
    section("Attempts", attempts.length, timeline(attempts)),
    calls.length ? section("Call journal", calls.length, journal(calls, attempts)) : null,
    section("Outputs", outputs.length, artifactTable(outputs, data, ctx)),
    deliveries.length ? section("Deliveries", deliveries.length, bySink(deliveries)) : null,
  );
}

function section(title, n, body) {
  return el("div", { class: "part" }, el("h3", {}, title, " ", el("span", { class: "count" }, count.format(n))), body);
}

/** A map's elements, in element order, as a section of its panel. */
function mapElements(name, data, ctx) {
  const all = data.stages.filter((s) => s.stage.startsWith(`${name}[`)).sort((a, b) => byName(a.stage, b.stage));
  return section("Elements", all.length, elementList(name, all, ctx));
}

/** Each element as a button that chooses it; those not succeeded first. */
function elementList(name, all, ctx) {
  if (!all.length) return el("p", { class: "muted" }, "Not expanded yet: its list is not stored.");
  const shown = [...all.filter((s) => s.state !== "succeeded"), ...all.filter((s) => s.state === "succeeded")];
  const most = 200;
  return el(
    "div",
    { class: "elements" },
    shown.slice(0, most).map((s) =>
      el("button", { type: "button", class: `element state-${s.state}`, title: s.state, onclick: () => ctx.select(s.stage) }, s.stage.slice(name.length)),
    ),
    shown.length > most ? el("span", { class: "muted" }, ` and ${count.format(shown.length - most)} more`) : null,
  );
}

function facts(job, data) {
  const plugin = data.plugins.find((p) => p.digest === job.plugin_digest);
  const rows = [
    ["Kind", job.gate != null ? "approval gate" : job.map ? `maps over ${job.map}` : "stage"],
    job.plugin_digest
      ? ["Plugin", plugin ? `${plugin.name} ${plugin.version} ` : "", digest(job.plugin_digest)]
      : null,
    job.gate != null ? ["Asks", job.gate] : null,
    job.map_count != null ? ["Elements", count.format(job.map_count)] : null,
    ["Attempt", `${job.attempt} of ${job.max_attempts}`],
    job.lease_owner ? ["Leased to", job.lease_owner, " until ", time(job.lease_expires_at)] : null,
    job.last_error ? ["Last error", el("span", { class: "error" }, job.last_error)] : null,
  ].filter(Boolean);
  return el("dl", { class: "facts" }, rows.map(([term, ...value]) => [el("dt", {}, term), el("dd", {}, ...value)]));
}

function decision(stage, ctx) {
  const act = (verdict, label, question) =>
    el("button", {
      type: "button",
      class: verdict === "approve" ? "primary" : "danger",
      "data-action": verdict,
      onclick: () => ctx.act(question, label, path.gate(ctx.runId, stage, verdict), { by: "dashboard" }),
    }, label);
  return el(
    "div",
    { class: "actions", role: "group", "aria-label": "Decide the gate" },
    act("approve", "Approve", `Approve ${stage}? The stages after it run with this decision.`),
    act("reject", "Reject", `Reject ${stage}? The run fails for good.`),
  );
}

/** The stage's attempts on one time axis, oldest first. */
function timeline(attempts) {
  if (!attempts.length) return el("p", { class: "muted" }, "Not attempted yet.");
  const now = Date.now();
  const spans = attempts.map((a) => {
    const start = Date.parse(a.claimed_at);
    const end = a.finished_at ? Date.parse(a.finished_at) : now;
    return { a, start, end };
  });
  const t0 = Math.min(...spans.map((s) => s.start));
  const total = Math.max(1, Math.max(...spans.map((s) => s.end)) - t0);
  return el(
    "ol",
    { class: "timeline" },
    spans.map(({ a, start, end }) =>
      el(
        "li",
        { class: `attempt outcome-${a.outcome}`, "data-attempt": a.attempt, "data-outcome": a.outcome },
        el("div", { class: "who" }, el("strong", {}, `#${a.attempt}`), " ", el("span", { class: "worker" }, a.worker)),
        el(
          "div",
          { class: "track", "aria-hidden": "true" },
          el("span", {
            class: "bar",
            style: {
              left: `${((start - t0) / total) * 100}%`,
              width: `${Math.max(0.8, ((end - start) / total) * 100)}%`,
            },
          }),
        ),
        el(
          "div",
          { class: "what" },
          badge(a.outcome),
          " ",
          " ",
          time(a.claimed_at),
          a.finished_at ? [" to ", clock(a.finished_at), ` (${duration(end - start)})`] : " · running",
          proposal(a),
        ),
        a.error ? el("pre", { class: "error" }, a.error) : null,
      ),
    ),
  );
}

function proposal(attempt) {
  if (attempt.proposal_won === true) return el("span", { class: "won" }, " · its proposal is the stored artifact");
  if (attempt.proposal_won === false) {
    return el("span", { class: "lost", "data-proposal": "lost" }, " · its proposal lost to the stored artifact; it continued from that");
  }
  return null;
}

/** Each model call and HTTP request, the attempt that first asked it, and later attempts it was replayed to. */
function journal(calls, attempts) {
  return el(
    "ol",
    { class: "journal" },
    calls.map((call) => {
      const replayed = attempts
        .filter((a) => a.attempt > call.attempt && a.outcome === "succeeded")
        .map((a) => `#${a.attempt}`);
      return el(
        "li",
        {
          "data-call": call.index,
          "data-asked-by": call.attempt,
          "data-replayed-to": replayed.join(" "),
          "data-tokens": call.usage ? `${call.usage.prompt_tokens}+${call.usage.completion_tokens}` : "",
          "data-model": call.model ?? "",
          "data-finish": call.finish_reason ?? "",
          "data-kind": call.kind,
          "data-status": call.http ? call.http.status : "",
        },
        el(
          "div",
          {},
          el("strong", {}, `Call ${call.index}`),
          call.kind === "http" ? " · HTTP" : null,
          call.http ? ` · status ${call.http.status}` : null,
          " · request ",
          digest(call.request_digest),
          ` · asked by attempt #${call.attempt}`,
          call.model ? ` · ${call.model}` : null,
          call.usage ? ` · ${call.usage.prompt_tokens} + ${call.usage.completion_tokens} tokens` : null,
          call.finish_reason && call.finish_reason !== "stop" ? ` · ended: ${call.finish_reason}` : null,
          replayed.length ? el("span", { class: "replayed" }, ` · replayed to attempt ${replayed.join(", ")}`) : null,
          call.rejected ? el("span", { class: "error" }, " · refused by the backend") : null,
        ),
        el("pre", { class: "answer" }, call.http ? httpBody(call.http.body) : call.response),
      );
    }),
  );
}

/** A journaled HTTP body (base64 in the API) as text, cut for the page. */
function httpBody(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const text = new TextDecoder().decode(bytes.subarray(0, 4096));
  return bytes.length > 4096 ? `${text}\n… (${bytes.length} bytes)` : text;
}

function bySink(deliveries) {
  const sinks = [...new Set(deliveries.map((d) => d.sink))];
  return sinks.map((sink) =>
    el(
      "div",
      { class: "sink" },
      el("h4", {}, sink),
      el(
        "table",
        {},
        el("thead", {}, el("tr", {}, ["Event", "State", "Attempts", "Last answer", "Delivered"].map((h) => el("th", { scope: "col" }, h)))),
        el(
          "tbody",
          {},
          deliveries
            .filter((d) => d.sink === sink)
            .map((d) =>
              el(
                "tr",
                { "data-delivery": d.id },
                el("td", {}, d.event),
                el("td", {}, badge(d.state)),
                el("td", {}, d.attempts),
                el("td", {}, [d.last_status, d.last_error].filter((x) => x != null).join(" ") || "—"),
                el("td", {}, time(d.delivered_at)),
              ),
            ),
        ),
      ),
    ),
  );
}

/**
 * Every stage that reads `artifact`, with each of its attempts' digest of
 * that input and whether it is the canonical digest.
 */
export function consumers(artifact, data) {
  return data.graph.inputs
    .filter((i) => i.from_stage === artifact.stage && i.from_output === artifact.output)
    .map((i) => ({
      stage: i.stage,
      input: i.input,
      reads: data.attempts
        .filter((a) => a.stage === i.stage && a.input_digests && i.input in a.input_digests)
        .map((a) => ({ attempt: a.attempt, digest: a.input_digests[i.input] })),
    }));
}

/** The stage name of a run's input (`$input` in a pipeline). */
const RUN_INPUT = "$run";

const TEXT = /^(text\/|application\/(json|xml|toml|yaml|x-ndjson)|[^;]*\+(json|xml))/;

/** Artifacts with their provenance; each can be viewed and downloaded. */
export function artifactTable(artifacts, data, ctx) {
  if (!artifacts.length) return el("p", { class: "muted" }, "None stored yet.");
  const key = (a) => `${a.stage}.${a.output}`;
  const ordered = [...artifacts].sort((a, b) => byName(key(a), key(b)));
  const rows = ordered.flatMap((artifact) => {
    const name = key(artifact);
    const viewer = el("td", { colspan: 5, class: "viewer" });
    const viewing = ctx.viewing.has(name);
    if (viewing) show(viewer, artifact, ctx);
    const toggle = () => {
      if (ctx.viewing.has(name)) ctx.viewing.delete(name);
      else ctx.viewing.add(name);
      ctx.redraw();
    };
    return [
      el(
        "tr",
        { "data-artifact": name },
        el("th", { scope: "row" }, el("code", {}, name), el("div", { class: "muted" }, artifact.media_type)),
        el("td", {}, `${count.format(artifact.size)} B`, el("div", {}, digest(artifact.digest))),
        el(
          "td",
          {},
          made(artifact),
        ),
        el("td", {}, readers(artifact, data)),
        el(
          "td",
          {},
          el("button", { type: "button", class: "quiet", "aria-expanded": viewing ? "true" : "false", onclick: toggle }, viewing ? "Hide" : "View"),
        ),
      ),
      viewing ? el("tr", { class: "viewer-row" }, viewer) : null,
    ];
  });
  return el(
    "table",
    { class: "artifacts" },
    el(
      "thead",
      {},
      el("tr", {}, ["Artifact", "Size and digest", "Made by", "Read by", ""].map((h) => el("th", { scope: "col" }, h))),
    ),
    el("tbody", {}, rows),
  );
}

function made(artifact) {
  if (artifact.stage === RUN_INPUT) return "submitted with the run";
  if (!artifact.plugin_digest) return `attempt #${artifact.attempt} of the host`;
  return [`attempt #${artifact.attempt}`, el("div", {}, digest(artifact.plugin_digest))];
}

function readers(artifact, data) {
  const found = consumers(artifact, data);
  if (!found.length) return el("span", { class: "muted" }, "no stage reads it");
  return el(
    "ul",
    { class: "readers" },
    found.map((c) =>
      el(
        "li",
        {},
        el("code", {}, `${c.stage}.${c.input}`),
        " ",
        marks(c, artifact, data),
      ),
    ),
  );
}

/** How one reader read the artifact: each attempt's digest against the canonical one. */
function marks(reader, artifact, data) {
  const job = data.stages.find((s) => s.stage === reader.stage);
  if (job?.map === `${artifact.stage}.${artifact.output}`) {
    return el("span", { class: "muted" }, "maps over it: each element is read by a job of its own");
  }
  if (!reader.reads.length) return el("span", { class: "muted" }, "not read yet");
  return reader.reads.map((r) => {
    const same = r.digest === artifact.digest;
    return el(
      "span",
      {
        class: same ? "canonical-ok" : "canonical-differs",
        title: same ? "read the canonical digest" : `read ${r.digest}, not the canonical ${artifact.digest}`,
        "data-reader": `${reader.stage}.${reader.input}#${r.attempt}`,
      },
      `#${r.attempt} ${same ? "✓ canonical" : "✗ not canonical"}`,
    );
  });
}

/** Fills `cell` with the artifact's bytes: text shown, anything else as size and digest; both downloadable. */
async function show(cell, artifact, ctx) {
  cell.replaceChildren(el("span", { class: "muted" }, "Loading…"));
  try {
    const blob = await bytes(path.artifact(ctx.runId, artifact.stage, artifact.output));
    const name = `${artifact.stage}.${artifact.output}`.replace(/[^\w.[\]-]/g, "_");
    const link = el("a", { href: URL.createObjectURL(blob), download: name, class: "button quiet" }, "Download");
    const body = TEXT.test(artifact.media_type)
      ? el("pre", { class: "content" }, await blob.slice(0, 65536).text(), blob.size > 65536 ? "\n… (first 64 KiB shown)" : "")
      : el("p", {}, `Binary: ${count.format(blob.size)} bytes, `, digest(artifact.digest));
    cell.replaceChildren(body, link);
  } catch (e) {
    ctx.fail(e);
    cell.replaceChildren(el("span", { class: "error" }, e.message));
  }
}
