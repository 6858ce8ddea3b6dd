//! Outgoing HTTP through the standard `wasi:http/outgoing-handler`, so a
//! guest's own HTTP library works unchanged. The host sends the request
//! itself (wasmtime-wasi-http hands it over through [`WasiHttpHooks`]):
//!
//! - only to a host both the manifest's `allowed_hosts` and the policy's
//!   `[http] allowed_hosts` allow; anything else is answered
//!   `HTTP-request-denied` and no connection is made;
//! - with `{{secret:NAME}}` in a header replaced by the secret's value on
//!   the way out, when the policy grants that secret to the plugin;
//! - journaled canonical-first under the stage's next call index (shared
//!   with model calls): the digest covers method, URI, headers as the guest
//!   wrote them (placeholders, not values) and body; the response (status,
//!   headers, body up to `limits.max_http_response_bytes`) is stored with
//!   every secret's value replaced by its placeholder, and the guest is
//!   handed the stored row. A retry meets the recorded response and the
//!   server is not asked again; a retry asking something else there fails
//!   for good, as with the model.
//!
//! Redirects are not followed (the guest sees the 3xx and may follow it,
//! through the same checks). A transport failure is told to the guest and
//! fails the attempt, retryably: nothing was recorded, the retry asks again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use sha2::{Digest, Sha256};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::super::{ExecReport, Invocation, Policy};
use super::{CallContext, FailureSlot, HostFailure, Services};
use crate::manifest::{HostPattern, any_allows};
use crate::store::{CallKind, HttpReply, ModelCall, ModelCallPut};

/// A future wasi-http polls for errors of a response body's transfer (none
/// here: the body is in memory).
pub(super) type Transfer = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// What an exchange ends with: the response, or the error the guest sees.
type Exchanged = Result<(http::Response<WasiBody>, Transfer), HttpError>;

/// What `send_request` returns.
pub(super) type Sent = Box<dyn Future<Output = Exchanged> + Send>;

/// The policy's secrets with their values, read from the environment once
/// when the host starts. `Debug` shows names only.
pub(crate) struct Secrets {
    by_name: BTreeMap<String, Secret>,
}

struct Secret {
    /// `None`: the environment variable was not set.
    value: Option<String>,
    plugins: Option<BTreeSet<String>>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

impl Secrets {
    pub fn from_policy(policy: &Policy) -> Self {
        let by_name = policy
            .secrets()
            .iter()
            .map(|(name, grant)| {
                let value = std::env::var(&grant.env).ok().filter(|v| !v.is_empty());
                if value.is_none() {
                    tracing::warn!(
                        secret = %name,
                        env = %grant.env,
                        "secret `{name}` reads {}, which is not set: requests that use it are denied",
                        grant.env
                    );
                }
                let secret = Secret {
                    value,
                    plugins: grant.plugins.clone(),
                };
                (name.clone(), secret)
            })
            .collect();
        Self { by_name }
    }

    /// The value of `name` for `plugin`, or why it may not have it.
    fn value_for(&self, name: &str, plugin: &str) -> Result<&str, String> {
        let secret = self.by_name.get(name).ok_or_else(|| {
            format!("secret `{name}` is not named in the operator's policy ([secrets.{name}])")
        })?;
        if let Some(plugins) = &secret.plugins
            && !plugins.contains(plugin)
        {
            return Err(format!(
                "secret `{name}` is not granted to plugin `{plugin}` (its `plugins` list in the policy)"
            ));
        }
        secret.value.as_deref().ok_or_else(|| {
            format!("secret `{name}` has no value (its environment variable is not set)")
        })
    }

    /// Replaces every secret's value in `bytes` by its placeholder.
    fn scrub(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        for (name, secret) in &self.by_name {
            if let Some(value) = &secret.value {
                out = replace_all(&out, value.as_bytes(), placeholder(name).as_bytes());
            }
        }
        out
    }
}

fn placeholder(name: &str) -> String {
    format!("{{{{secret:{name}}}}}")
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return haystack.to_vec();
    }
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// `value` with every `{{secret:NAME}}` replaced by the secret's value, or
/// why a secret may not be used. `None`: no placeholder in it.
fn substitute(value: &str, secrets: &Secrets, plugin: &str) -> Result<Option<String>, String> {
    const OPEN: &str = "{{secret:";
    if !value.contains(OPEN) {
        return Ok(None);
    }
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let end = after
            .find("}}")
            .ok_or_else(|| "a `{{secret:` placeholder is not closed with `}}`".to_string())?;
        let name = &after[..end];
        out.push_str(
            secrets
                .value_for(name, plugin)
                .map_err(|why| crate::text::bounded(&why, 300))?,
        );
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(Some(out))
}

/// Calls counted for the attempt's report, from the spawned exchanges.
#[derive(Debug, Default)]
struct Counts {
    fresh: AtomicU32,
    replayed: AtomicU32,
    denied: AtomicU32,
}

/// The `http` capability of one attempt.
pub(super) struct HttpCapability {
    /// `None` when the attempt is not granted the capability.
    grant: Option<Grant>,
    counts: Arc<Counts>,
}

#[derive(Clone)]
struct Grant {
    services: Services,
    plugin: String,
    manifest_hosts: Arc<[HostPattern]>,
    max_bytes: u64,
}

impl HttpCapability {
    pub fn new(
        granted: bool,
        services: &Services,
        plugin: &str,
        manifest_hosts: &[HostPattern],
        max_bytes: u64,
    ) -> Self {
        Self {
            grant: granted.then(|| Grant {
                services: services.clone(),
                plugin: plugin.to_string(),
                manifest_hosts: manifest_hosts.into(),
                max_bytes,
            }),
            counts: Arc::default(),
        }
    }

    pub fn report(&self, report: &mut ExecReport) {
        report.http_calls_fresh = self.counts.fresh.load(Ordering::Relaxed);
        report.http_calls_replayed = self.counts.replayed.load(Ordering::Relaxed);
        report.http_requests_denied = self.counts.denied.load(Ordering::Relaxed);
    }

    /// The checks made before anything is sent or journaled: the grant,
    /// both allow-lists and the secrets. `Ok` holds the headers to send.
    fn admit(&self, request: &http::Request<WasiBody>) -> Result<(Grant, HeaderMap), String> {
        let grant = self.grant.clone().ok_or_else(|| {
            "the `http` capability is not granted: the manifest must ask for it and the operator's policy must grant it".to_string()
        })?;
        let uri = request.uri();
        let host = uri.host().unwrap_or_default();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = uri.port_u16();
        let shown = crate::text::bounded(uri.authority().map_or("", |a| a.as_str()), 200);
        if !any_allows(&grant.manifest_hosts, host, port, https) {
            return Err(format!(
                "`{shown}` is not in the manifest's `allowed_hosts`"
            ));
        }
        if !any_allows(&grant.services.http_hosts, host, port, https) {
            return Err(format!(
                "`{shown}` is not in the operator's `[http] allowed_hosts`"
            ));
        }
        let mut headers = request.headers().clone();
        for value in headers.values_mut() {
            let Ok(text) = value.to_str() else { continue };
            if let Some(filled) = substitute(text, &grant.services.secrets, &grant.plugin)? {
                *value = HeaderValue::from_str(&filled)
                    .map_err(|_| "a secret's value is not a valid header value".to_string())?;
                value.set_sensitive(true);
            }
        }
        Ok((grant, headers))
    }
}

impl WasiHttpHooks for CallContext {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Transfer,
    ) -> Sent {
        if self.count_call().is_err() {
            return Box::new(async {
                Err(HttpError::InternalError(Some(
                    "host call limit exceeded".into(),
                )))
            });
        }
        let (grant, headers) = match self.http.admit(&request) {
            Ok(admitted) => admitted,
            Err(why) => {
                self.http.counts.denied.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    run = %self.inv.run_id,
                    stage = %self.inv.stage,
                    "HTTP request denied: {why}"
                );
                return Box::new(deny(request));
            }
        };
        let exchange = Exchange {
            grant,
            inv: self.inv.clone(),
            index: self.next_call,
            counts: self.http.counts.clone(),
            failure: self.failure.clone(),
            options,
        };
        self.next_call += 1;
        Box::new(exchange.run(request, headers))
    }
}

/// Answers `HTTP-request-denied` once the guest has written the request's
/// body (read and dropped, up to a bound): a client that writes the body
/// while it waits for the response then sees the denial, not a broken
/// stream.
pub(super) async fn deny(request: http::Request<WasiBody>) -> Exchanged {
    const DRAINED: usize = 1 << 20;
    let _ = Limited::new(request.into_body(), DRAINED).collect().await;
    Err(HttpError::HttpRequestDenied)
}

/// One request on its way: everything it needs outside the store.
struct Exchange {
    grant: Grant,
    inv: Invocation,
    index: i64,
    counts: Arc<Counts>,
    failure: FailureSlot,
    options: Option<RequestOptions>,
}

/// Why an exchange gave the guest no response, and whether that also fails
/// the attempt.
struct Refused {
    error: HttpError,
    failure: Option<HostFailure>,
}

impl Exchange {
    async fn run(self, request: http::Request<WasiBody>, headers: HeaderMap) -> Exchanged {
        match self.answer(request, headers).await {
            Ok(call) => {
                // A refusal's row (a body over the cap) has no response.
                let reply = call.http.ok_or(HttpError::HttpResponseBodySize(None))?;
                let done: Transfer = Box::new(async { Ok(()) });
                Ok((response(reply), done))
            }
            Err(Refused { error, failure }) => {
                if let Some(failure) = failure {
                    self.failure.fail(failure);
                }
                Err(error)
            }
        }
    }

    /// The journaled response to the request: recorded by an earlier
    /// attempt, or asked now and recorded before the guest sees it.
    async fn answer(
        &self,
        request: http::Request<WasiBody>,
        headers: HeaderMap,
    ) -> Result<ModelCall, Refused> {
        let (parts, body) = request.into_parts();
        let max = usize::try_from(self.grant.max_bytes).unwrap_or(usize::MAX);
        let body = Limited::new(body, max)
            .collect()
            .await
            .map_err(|_| Refused {
                error: HttpError::HttpRequestBodySize(Some(self.grant.max_bytes)),
                failure: None,
            })?
            .to_bytes();
        let digest = request_digest(&parts, &body);
        let journal = &self.grant.services.journal;
        let recorded = journal
            .model_call_get(&self.inv.run_id, &self.inv.stage, self.index)
            .await
            .map_err(|e| journal_failed(e.to_string()))?;
        let call = match recorded {
            Some(call) => call,
            None => {
                let put = self.send(parts, headers, body, &digest).await?;
                let call = journal
                    .model_call_put(put)
                    .await
                    .map_err(|e| journal_failed(e.to_string()))?;
                tracing::debug!(
                    run = %self.inv.run_id,
                    stage = %self.inv.stage,
                    index = self.index,
                    status = call.http.as_ref().map(|r| r.status),
                    "HTTP response journaled"
                );
                call
            }
        };
        if call.attempt == self.inv.attempt {
            self.counts.fresh.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counts.replayed.fetch_add(1, Ordering::Relaxed);
        }
        if call.kind != CallKind::Http || call.request_digest != digest {
            return Err(Refused {
                error: HttpError::HttpRequestDenied,
                failure: Some(HostFailure::NonDeterminism {
                    index: self.index,
                    recorded: call.kind.request(&call.request_digest),
                    now: CallKind::Http.request(&digest),
                }),
            });
        }
        crate::crash::point("after_http_call");
        Ok(call)
    }

    /// Sends the request with its secrets filled in, and reads the response
    /// up to the cap, secrets scrubbed: the row to journal.
    async fn send(
        &self,
        parts: http::request::Parts,
        headers: HeaderMap,
        body: Bytes,
        digest: &str,
    ) -> Result<ModelCallPut, Refused> {
        let services = &self.grant.services;
        let url = reqwest::Url::parse(&parts.uri.to_string()).map_err(|_| Refused {
            error: HttpError::HttpRequestUriInvalid,
            failure: None,
        })?;
        let mut send = services
            .http_client
            .request(parts.method, url)
            .headers(headers)
            .body(body);
        if let Some(timeout) = self.options.as_ref().and_then(|o| o.first_byte_timeout) {
            send = send.timeout(timeout);
        }
        let mut response = send.send().await.map_err(transport_failed)?;
        let status = response.status().as_u16();
        let secrets = &services.secrets;
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(&secrets.scrub(value.as_bytes())).into_owned();
                (name.as_str().to_string(), value)
            })
            .collect();
        let mut body = Vec::new();
        let mut over = false;
        while let Some(chunk) = response.chunk().await.map_err(transport_failed)? {
            if (body.len() + chunk.len()) as u64 > self.grant.max_bytes {
                over = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let (response, rejected, http) = if over {
            let why = format!(
                "the response body is over {} bytes (limits.max_http_response_bytes)",
                self.grant.max_bytes
            );
            (why, true, None)
        } else {
            let body = secrets.scrub(&body);
            let reply = HttpReply {
                status,
                headers,
                body,
            };
            (String::new(), false, Some(reply))
        };
        Ok(ModelCallPut {
            run_id: self.inv.run_id.clone(),
            stage: self.inv.stage.clone(),
            index: self.index,
            request_digest: digest.to_string(),
            response,
            rejected,
            attempt: self.inv.attempt,
            now: services.clock.now_ms(),
            usage: None,
            finish_reason: None,
            model: None,
            kind: CallKind::Http,
            http,
        })
    }
}

/// SHA-256 of the request as the guest wrote it: method, URI, headers
/// (secret placeholders, not values) and body.
fn request_digest(parts: &http::request::Parts, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"ratchet http request 1\n");
    h.update(parts.method.as_str());
    h.update(b"\n");
    h.update(parts.uri.to_string());
    h.update(b"\n");
    for (name, value) in &parts.headers {
        h.update(name.as_str());
        h.update(b": ");
        h.update(value.as_bytes());
        h.update(b"\n");
    }
    h.update(b"\n");
    h.update(body);
    hex::encode(h.finalize())
}

fn response(reply: HttpReply) -> http::Response<WasiBody> {
    let mut builder = http::Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            builder = builder.header(name, value);
        }
    }
    let body = Full::new(Bytes::from(reply.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    builder.body(body).unwrap_or_else(|_| {
        let mut fallback = http::Response::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *fallback.status_mut() = http::StatusCode::BAD_GATEWAY;
        fallback
    })
}

fn journal_failed(e: String) -> Refused {
    Refused {
        error: HttpError::InternalError(Some("the HTTP journal is unavailable".into())),
        failure: Some(HostFailure::Journal(e)),
    }
}

/// The server could not be reached or broke off: the guest is told, and
/// the attempt fails retryably (nothing was recorded).
fn transport_failed(e: reqwest::Error) -> Refused {
    let error = if e.is_timeout() {
        HttpError::ConnectionTimeout
    } else if e.is_connect() {
        HttpError::ConnectionRefused
    } else {
        HttpError::HttpProtocolError
    };
    Refused {
        error,
        failure: Some(HostFailure::Http(format!(
            "the HTTP request failed: {}",
            crate::text::bounded(&e.without_url().to_string(), 300)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(plugins: Option<&[&str]>) -> Secrets {
        let secret = Secret {
            value: Some("s3cr3t-value".into()),
            plugins: plugins.map(|p| p.iter().map(|s| s.to_string()).collect()),
        };
        Secrets {
            by_name: [("search".to_string(), secret)].into(),
        }
    }

    /// Seen failing with the plugin list ignored (`other` got the value).
    #[test]
    fn placeholders_are_filled_only_with_granted_secrets() {
        let all = secrets(None);
        assert_eq!(
            substitute("Bearer {{secret:search}}", &all, "fetch"),
            Ok(Some("Bearer s3cr3t-value".into()))
        );
        assert_eq!(substitute("plain", &all, "fetch"), Ok(None));
        let err = substitute("{{secret:vault}}", &all, "fetch").expect_err("unnamed");
        assert!(err.contains("not named"), "{err}");
        let only = secrets(Some(&["fetch"]));
        let err = substitute("{{secret:search}}", &only, "other").expect_err("not granted");
        assert!(err.contains("not granted to plugin `other`"), "{err}");
        assert!(substitute("{{secret:search", &all, "fetch").is_err());
    }

    /// Seen failing with `scrub` a no-op: the echoed value was kept.
    #[test]
    fn an_echoed_value_is_replaced_by_its_placeholder() {
        let s = secrets(None);
        let scrubbed = s.scrub(b"you sent s3cr3t-value, twice: s3cr3t-value.");
        assert_eq!(
            scrubbed,
            b"you sent {{secret:search}}, twice: {{secret:search}}.".to_vec()
        );
        assert_eq!(format!("{s:?}"), r#"{"search"}"#);
    }
}
