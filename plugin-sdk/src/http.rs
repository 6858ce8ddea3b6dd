//! HTTP through the host's `wasi:http` ([`Context::http`](crate::Context::http)):
//! a small blocking client for stages, sent by wstd on Wasm.
//!
//! The host sends a request only to a host that both the manifest's
//! `allowed_hosts` and the operator's policy allow, fills in
//! `{{secret:NAME}}` placeholders in headers with secrets the operator
//! grants (the value never reaches the stage), and journals the response:
//! a retry is handed the recorded response, and the server is asked once.

/// A request to send. Build it with [`HttpRequest::get`] or
/// [`HttpRequest::post`], then add headers and a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpRequest {
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Self {
            method: method.to_string(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url)
    }

    pub fn post(url: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self::new("POST", url).body(body)
    }

    /// A header. `{{secret:NAME}}` in its value is replaced by the host with
    /// the secret the operator's policy names `NAME`, on the way out.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// A JSON body, with its `content-type`.
    pub fn json<T: serde::Serialize>(self, value: &T) -> Result<Self, crate::Error> {
        let body = serde_json::to_vec(value)
            .map_err(|e| crate::Error::fatal(format!("the request body cannot be encoded: {e}")))?;
        Ok(self.header("content-type", "application/json").body(body))
    }
}

/// A response as the host journaled it: any secret's value it echoed is
/// replaced by its placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The first header of that name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn text(&self) -> Result<&str, crate::Error> {
        std::str::from_utf8(&self.body)
            .map_err(|e| crate::Error::fatal(format!("the response body is not UTF-8: {e}")))
    }

    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::Error> {
        serde_json::from_slice(&self.body).map_err(|e| {
            crate::Error::fatal(format!("the response body is not the expected JSON: {e}"))
        })
    }
}

/// Sends through `wasi:http/outgoing-handler`, waiting for the whole body.
#[cfg(target_arch = "wasm32")]
pub(crate) fn send(request: &HttpRequest) -> Result<HttpResponse, crate::Error> {
    use wstd::http::{Body, Client, Request};
    let mut builder = Request::builder()
        .method(request.method.as_str())
        .uri(request.url.as_str());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let outgoing = builder
        .body(Body::from(request.body.clone()))
        .map_err(|e| crate::Error::fatal(format!("invalid HTTP request: {e}")))?;
    wstd::runtime::block_on(async move {
        let mut response = Client::new().send(outgoing).await.map_err(failed)?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_string(), value)
            })
            .collect();
        let body = response
            .body_mut()
            .contents()
            .await
            .map_err(failed)?
            .to_vec();
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    })
}

#[cfg(target_arch = "wasm32")]
fn failed(e: wstd::http::Error) -> crate::Error {
    use wstd::http::ErrorCode;
    match e.downcast_ref::<ErrorCode>() {
        Some(ErrorCode::HttpRequestDenied) => crate::Error::fatal(
            "the host denied the HTTP request: its host must be in the manifest's `allowed_hosts` and the operator's policy, and every secret it names granted",
        ),
        Some(code) => crate::Error::retryable(format!("the HTTP request failed: {code:?}")),
        None => crate::Error::retryable(format!("the HTTP request failed: {e}")),
    }
}
