// What every view builds with: elements, times in the viewer's own time
// zone, state badges, short digests, the confirmation dialog and the
// message line.

/** An HTML element: `el("a", { href: "/" }, "text", child)`. */
export function el(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, the same way. */
export function svg(tag, attrs = {}, ...children) {
  return build(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, children);
}

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    // Through CSSOM: the page's policy refuses inline style attributes.
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const TIME = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

/** An RFC 3339 time as the viewer's local time, the exact time on hover. */
export function time(rfc3339) {
  if (!rfc3339) return el("span", { class: "muted" }, "—");
  const at = new Date(rfc3339);
  return el("time", { datetime: rfc3339, title: rfc3339 }, TIME.format(at));
}

const CLOCK = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });

/** Only the time of day, for an end shown beside its start. */
export function clock(rfc3339) {
  return el("time", { datetime: rfc3339, title: rfc3339 }, CLOCK.format(new Date(rfc3339)));
}

export function duration(ms) {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
}

export const count = new Intl.NumberFormat(undefined);

export function badge(state) {
  return el("span", { class: `badge state-${state}` }, state.replaceAll("_", " "));
}

/** A digest shortened for reading, whole on hover and when copied. */
export function digest(value) {
  if (!value) return el("span", { class: "muted" }, "—");
  const hex = value.replace(/^sha256:/, "");
  return el("code", { class: "digest", title: value }, hex.slice(0, 12));
}

/** Natural order: `each[2]` before `each[10]`. */
export const byName = new Intl.Collator(undefined, { numeric: true }).compare;

/**
 * Asks the operator to confirm `question`; resolves true if they did.
 * One `<dialog>`, in the page, with the action named on its button.
 */
export function confirm(question, action) {
  const dialog = document.getElementById("confirm");
  dialog.querySelector("p").textContent = question;
  const yes = dialog.querySelector("[data-confirm]");
  yes.textContent = action;
  dialog.returnValue = "";
  for (const button of dialog.querySelectorAll("[data-answer]")) {
    button.onclick = () => dialog.close(button.dataset.answer);
  }
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

let toastTimer;

/** Tells the operator something in the message line (`role=alert`). */
export function say(message, kind = "error") {
  const toast = document.getElementById("toast");
  toast.className = `toast ${kind}`;
  toast.textContent = message;
  toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (toast.hidden = true), 8000);
}
