//! Classification of SDK errors into what the processor needs to decide on.

use std::fmt;

/// What a failed Cosmos request means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 404: the resource does not exist.
    NotFound,
    /// 409: a resource with that id exists already.
    Conflict,
    /// 412: the If-Match ETag is stale.
    PreconditionFailed,
    /// 410/1002 or 410/1007: the feed range is gone (split or merge).
    RangeGone,
    /// 500/20206: the SDK exhausted its split retries (split lock window); rebuild the reader.
    SplitInProgress,
    /// 429, 503, 408 and other retryable conditions.
    Transient,
    /// 401: the account refused the credential (a wrong or rotated key, a token it does not accept).
    Unauthorized,
    /// 403: the credential is accepted but may not do this (data-plane RBAC without the action,
    /// metadata writes disabled for keys, a firewall).
    Forbidden,
    /// 400: the request is malformed (for example a wrong partition key).
    BadRequest,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// A short label (for metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::PreconditionFailed => "precondition_failed",
            ErrorKind::RangeGone => "range_gone",
            ErrorKind::SplitInProgress => "split_in_progress",
            ErrorKind::Transient => "transient",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Other => "other",
        }
    }

    /// Whether retrying the same request later can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Transient | ErrorKind::SplitInProgress | ErrorKind::Other
        )
    }
}

/// A failed Cosmos request: its classification, HTTP status, sub-status and message.
#[derive(Debug, Clone, thiserror::Error)]
pub struct CosmosError {
    /// What the failure means.
    pub kind: ErrorKind,
    /// HTTP status code (0 when the request never reached a server).
    pub status: u16,
    /// Cosmos sub-status code, when present.
    pub sub_status: Option<u32>,
    /// The SDK's message.
    pub message: String,
    /// How long the service asked the client to wait before trying again, in milliseconds (a
    /// 429's `x-ms-retry-after-ms`), when it said (milliseconds keep the error small).
    pub retry_after_ms: Option<u32>,
}

impl fmt::Display for CosmosError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.status, self.sub_status) {
            (0, _) => write!(f, "{}", self.message),
            (status, Some(sub)) => write!(f, "{} (status {status}/{sub})", self.message),
            (status, None) => write!(f, "{} (status {status})", self.message),
        }
    }
}

impl CosmosError {
    /// Builds an error of the given kind without an SDK source (local validation failures).
    pub fn local(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            status: 0,
            sub_status: None,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// Whether the service refused the request for its provisioned throughput (429).
    pub fn is_throttled(&self) -> bool {
        self.status == 429
    }

    /// How long the service asked the client to wait before trying again, when it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after_ms
            .map(|ms| std::time::Duration::from_millis(ms.into()))
    }

    /// Classifies a status / sub-status pair.
    pub fn classify(status: u16, sub_status: Option<u32>) -> ErrorKind {
        match (status, sub_status) {
            (404, _) => ErrorKind::NotFound,
            (409, _) => ErrorKind::Conflict,
            (412, _) => ErrorKind::PreconditionFailed,
            (410, Some(1002)) | (410, Some(1007)) => ErrorKind::RangeGone,
            (500, Some(20206)) => ErrorKind::SplitInProgress,
            (401, _) => ErrorKind::Unauthorized,
            (403, _) => ErrorKind::Forbidden,
            (400, _) => ErrorKind::BadRequest,
            (408, _) | (410, _) | (429, _) | (449, _) | (500..=599, _) | (0, _) => ErrorKind::Transient,
            _ => ErrorKind::Other,
        }
    }
}

impl From<azure_data_cosmos::CosmosError> for CosmosError {
    fn from(err: azure_data_cosmos::CosmosError) -> Self {
        let status = err.status();
        let code = u16::from(status.status_code());
        let sub_status = status.sub_status().map(|s| u32::from(s.value()));
        let mut message = err.to_string();
        // The SDK keeps the cause (for example the identity provider's answer) out of its message.
        let mut cause = std::error::Error::source(&err);
        while let Some(inner) = cause {
            let text = inner.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            cause = inner.source();
        }
        let retry_after_ms = err
            .response()
            .and_then(|r| r.headers().retry_after_ms)
            .map(|ms| u32::try_from(ms).unwrap_or(u32::MAX));
        Self {
            kind: Self::classify(code, sub_status),
            status: code,
            sub_status,
            message,
            retry_after_ms,
        }
    }
}

impl From<serde_json::Error> for CosmosError {
    fn from(err: serde_json::Error) -> Self {
        Self::local(ErrorKind::Other, format!("invalid JSON: {err}"))
    }
}

/// Why a container the processor needs could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProvisionError {
    /// The container does not exist, and creating it was not allowed.
    #[error("the container {name} does not exist; create it: {how_to_create}")]
    Missing {
        /// `database/container`.
        name: String,
        /// The Azure CLI commands that create it.
        how_to_create: String,
    },
    /// The container does not exist, and the account refused to create it (403).
    #[error(
        "the container {name} does not exist and this identity may not create containers ({source}); create it: {how_to_create}"
    )]
    CreationRefused {
        /// `database/container`.
        name: String,
        /// The Azure CLI commands that create it.
        how_to_create: String,
        /// The account's answer.
        source: CosmosError,
    },
    /// Reading or creating failed in another way.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
}

impl ProvisionError {
    /// The underlying Cosmos error, when there is one.
    pub fn cosmos(&self) -> Option<&CosmosError> {
        match self {
            ProvisionError::Missing { .. } => None,
            ProvisionError::CreationRefused { source, .. } | ProvisionError::Cosmos(source) => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_statuses_the_processor_acts_on() {
        let table = [
            (404, None, ErrorKind::NotFound),
            (409, None, ErrorKind::Conflict),
            (412, None, ErrorKind::PreconditionFailed),
            (410, Some(1002), ErrorKind::RangeGone),
            (410, Some(1007), ErrorKind::RangeGone),
            (500, Some(20206), ErrorKind::SplitInProgress),
            (429, Some(3200), ErrorKind::Transient),
            // A throughput bucket's budget spent: throttling like any 429.
            (429, Some(3212), ErrorKind::Transient),
            // The SDK's own 503s after its recovery failed: a read session not available
            // (from 404/1002), no write region accepting (403/3), account routing not recovered
            // (403/1008) — all of them pass with a failover or a refresh: tried again.
            (503, Some(20310), ErrorKind::Transient),
            (503, Some(20311), ErrorKind::Transient),
            (503, Some(20312), ErrorKind::Transient),
            (503, None, ErrorKind::Transient),
            (408, None, ErrorKind::Transient),
            (401, None, ErrorKind::Unauthorized),
            (403, Some(5301), ErrorKind::Forbidden),
            (403, None, ErrorKind::Forbidden),
            (400, None, ErrorKind::BadRequest),
        ];
        for (status, sub, want) in table {
            assert_eq!(CosmosError::classify(status, sub), want, "{status}/{sub:?}");
        }
    }
}
