//! Errors as E2B's API answers them: `{"code": STATUS, "message": ...}`
//! with that status, which both SDKs read (JS keys "not found" on the
//! body's `code`, Python parses the body before it looks at the status).

use agentos_http::kernel_link::KernelError;
use agentos_http::Body;
use agentos_proto::ErrorCode;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::Serialize;

/// A refusal, as the face answers it.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// E2B's machine word, where it has one.
    pub error_code: Option<&'static str>,
    /// Seconds a client should wait before asking again.
    pub retry_after: Option<u32>,
    /// The SDK retries 429 and 5xx on its own unless told not to: a
    /// create that may have happened must not be sent again.
    pub no_retry: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            error_code: None,
            retry_after: None,
            no_retry: false,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(sandbox: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{sandbox}\" not found"),
        )
    }

    pub fn with_code(mut self, error_code: &'static str) -> ApiError {
        self.error_code = Some(error_code);
        self
    }

    /// The kernel's refusal (or failure to answer) in HTTP's terms.
    pub fn from_kernel(err: &KernelError) -> ApiError {
        let Some(code) = err.refusal_code() else {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string());
        };
        let status = match code {
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::BadRequest | ErrorCode::PayloadTooLarge => StatusCode::BAD_REQUEST,
            ErrorCode::AlreadyExists => StatusCode::CONFLICT,
            ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorCode::LimitExceeded | ErrorCode::Busy => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut error = ApiError::new(status, err.to_string());
        if status == StatusCode::TOO_MANY_REQUESTS {
            error.retry_after = Some(1);
        }
        error
    }

    pub fn into_response(self) -> Response<Body> {
        #[derive(Serialize)]
        struct Shape<'a> {
            code: u16,
            message: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            error_code: Option<&'static str>,
        }
        let shape = Shape {
            code: self.status.as_u16(),
            message: &self.message,
            error_code: self.error_code,
        };
        let mut response = json(self.status, &shape);
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.no_retry {
            headers.insert("should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

/// A request body's JSON as `T`; an empty body is `{}` (the SDKs send
/// none where every field is optional).
pub fn json_or_empty<T: serde::de::DeserializeOwned>(body: &[u8]) -> serde_json::Result<T> {
    let body = if body.trim_ascii().is_empty() {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body)
}

/// A JSON response.
pub fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    // The face's own shapes always serialise; should one not, the client
    // gets an empty body with the status rather than a dropped request.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An empty response (204), which the JS SDK reads as no data.
pub fn no_content() -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}
