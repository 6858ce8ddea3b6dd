//! The operators' dashboard (docs/dashboard.md): a page and its scripts,
//! compiled into the binary, that read and act through the same API as
//! every other client. `/` is the runs list; a browser asking for
//! `/runs` or `/runs/{id}` (its `Accept` names `text/html`) gets the page,
//! a program gets JSON. The page holds no data, so it needs no token: its
//! scripts send the one the operator typed, kept in the tab's session
//! storage.

use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;

/// The page every dashboard URL loads; the scripts read the URL.
const PAGE: &str = include_str!("../../assets/dashboard/index.html");

/// The assets under `/ui/`, by name: (media type, content).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.css",
        "text/css",
        include_str!("../../assets/dashboard/app.css"),
    ),
    ("app.js", JS, include_str!("../../assets/dashboard/app.js")),
    ("api.js", JS, include_str!("../../assets/dashboard/api.js")),
    ("ui.js", JS, include_str!("../../assets/dashboard/ui.js")),
    (
        "graph.js",
        JS,
        include_str!("../../assets/dashboard/graph.js"),
    ),
    (
        "runs.js",
        JS,
        include_str!("../../assets/dashboard/runs.js"),
    ),
    ("run.js", JS, include_str!("../../assets/dashboard/run.js")),
    (
        "stage.js",
        JS,
        include_str!("../../assets/dashboard/stage.js"),
    ),
    (
        "icon.svg",
        "image/svg+xml",
        include_str!("../../assets/dashboard/icon.svg"),
    ),
];

const JS: &str = "text/javascript";

/// Scripts and styles from this server only; nothing framed, nothing
/// sniffed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Serves the page for a browser's navigation to a dashboard URL, and
/// passes every other request on.
pub async fn negotiate(request: Request, next: Next) -> Response {
    if wants_page(request.method(), request.uri().path(), request.headers()) {
        return page();
    }
    next.run(request).await
}

fn wants_page(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    if method != Method::GET {
        return false;
    }
    if path == "/" {
        return true;
    }
    let is_run = path
        .strip_prefix("/runs/")
        .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    let html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    html && (path == "/runs" || is_run)
}

fn page() -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response();
    harden(response.headers_mut());
    // The same URL answers JSON to programs: caches must tell them apart.
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    response
}

/// `GET /ui/{asset}`.
pub async fn asset(Path(name): Path<String>) -> Response {
    let Some((_, media, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return Problem::new(
            StatusCode::NOT_FOUND,
            format!("the dashboard has no asset `{name}`; open / instead"),
        )
        .into_response();
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, *media),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        *body,
    )
        .into_response();
    harden(response.headers_mut());
    response
}

fn harden(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_str(value).expect("a header value"),
        );
        headers
    }

    /// A browser's navigation gets the page; a program asking the same URL
    /// for JSON, another method, or a run's sub-resource does not. Seen
    /// failing with every `/runs/...` path taken as a run's page:
    /// `/runs/{id}/attempts` opened in a browser answered the page, not
    /// the JSON.
    #[test]
    fn only_a_browsers_navigation_gets_the_page() {
        let browser = accept("text/html,application/xhtml+xml,*/*;q=0.8");
        let program = accept("application/json");
        assert!(wants_page(&Method::GET, "/", &program));
        assert!(wants_page(&Method::GET, "/runs", &browser));
        assert!(wants_page(&Method::GET, "/runs/0193", &browser));
        assert!(!wants_page(&Method::GET, "/runs/0193", &program));
        assert!(!wants_page(&Method::GET, "/runs/0193/attempts", &browser));
        assert!(!wants_page(&Method::POST, "/runs", &browser));
        assert!(!wants_page(&Method::GET, "/runs/", &browser));
    }

    /// Every asset the page and the scripts name is served. Seen failing
    /// with `ui.js` left out of the table, which every view imports.
    #[test]
    fn every_asset_named_is_served() {
        let sources = std::iter::once(PAGE).chain(ASSETS.iter().map(|(_, _, body)| *body));
        for source in sources {
            for (i, _) in source.match_indices("/ui/") {
                let rest = &source[i + 4..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                    .unwrap_or(rest.len());
                let name = &rest[..end];
                assert!(
                    ASSETS.iter().any(|(n, _, _)| *n == name),
                    "`/ui/{name}` is named but not served"
                );
            }
        }
    }
}
