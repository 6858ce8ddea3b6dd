// The dashboard's shell: which view the URL names, links that change it
// without a reload, the sign-in form for a server that asks for a token,
// and how a refusal is told.

import { ApiError, Unauthorized, forgetToken, hasToken, setToken } from "/ui/api.js";
import { runPage } from "/ui/run.js";
import { runsPage } from "/ui/runs.js";
import { say } from "/ui/ui.js";

const main = document.getElementById("main");
const login = document.getElementById("login");
const logout = document.getElementById("logout");
let view = null;

const app = {
  /** Tells the operator why something failed; a 401 asks for the token. */
  fail(error) {
    if (error instanceof Unauthorized) {
      askToken(hasToken() ? "The server refused that token." : "");
    } else if (error instanceof ApiError) {
      say(error.message);
    } else if (error?.name !== "AbortError") {
      say(`The server could not be reached: ${error?.message ?? error}`);
    }
  },
  /** Whether the page follows a live event stream. */
  live(on) {
    const badge = document.getElementById("live");
    badge.textContent = on ? "● live" : "";
    badge.dataset.live = on ? "true" : "false";
  },
};

function route() {
  view?.stop();
  logout.hidden = !hasToken();
  const run = /^\/runs\/([^/]+)$/.exec(location.pathname);
  document.title = run ? `Run ${decodeURIComponent(run[1])} · Ratchet` : "Runs · Ratchet";
  view = run ? runPage(main, decodeURIComponent(run[1]), app) : runsPage(main, app);
}

function navigate(href) {
  history.pushState({}, "", href);
  route();
  window.scrollTo(0, 0);
}

function askToken(problem) {
  view?.stop();
  document.getElementById("login-error").textContent = problem;
  if (!login.open) login.showModal();
  document.getElementById("token").focus();
}

document.getElementById("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = document.getElementById("token").value.trim();
  if (!token) return;
  setToken(token);
  document.getElementById("token").value = "";
  login.close();
  route();
});

// Without the token nothing can be shown: Escape does not close the form.
login.addEventListener("cancel", (e) => e.preventDefault());

logout.addEventListener("click", () => {
  forgetToken();
  route();
});

// Links inside the dashboard change the view, not the page.
document.addEventListener("click", (e) => {
  const link = e.target.closest?.("a[data-nav]");
  if (!link || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  e.preventDefault();
  navigate(link.getAttribute("href"));
});

window.addEventListener("popstate", route);
route();
