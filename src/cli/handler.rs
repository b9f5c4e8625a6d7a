//! Building the handler the command line asks for (`cfp worker`, `cfp deadletter replay`).

use std::sync::Arc;

use super::args::{HandlerArgs, HandlerKind};
use crate::processor::{ChangeHandler, HttpHandler, HttpHandlerConfig, StdoutHandler};

/// Environment variables `CFP_HANDLER_HEADER_<NAME>` add header `<NAME>` (for values from Secrets).
pub const HEADER_ENV_PREFIX: &str = "CFP_HANDLER_HEADER_";

/// Why the handler flags cannot work.
#[derive(Debug, thiserror::Error)]
pub enum HandlerSetupError {
    /// `--handler http` without a URL.
    #[error("--handler http needs --handler-url (CFP_HANDLER_URL)")]
    MissingUrl,
    /// The URL does not parse.
    #[error("--handler-url {0:?}: {1}")]
    Url(String, url::ParseError),
    /// A `--handler-header` is not `NAME=VALUE` (only the part before a `:` is shown: the rest
    /// may be a secret).
    #[error("--handler-header expects NAME=VALUE, got a value without '=' for {0:?}")]
    Header(String),
    /// The HTTP handler refused its configuration.
    #[error(transparent)]
    Http(#[from] crate::processor::HttpHandlerError),
    /// Dead-lettering without a dead-letter container.
    #[error("--on-exhausted dead-letter needs --dead-letter-container (CFP_DEAD_LETTER_CONTAINER)")]
    NoDeadLetterContainer,
}

/// The handler `args` describe. `source` names the monitored container for CloudEvents
/// (`cosmosdb://{account}/dbs/{database}/colls/{container}`).
pub fn build(args: &HandlerArgs, source: String) -> Result<Arc<dyn ChangeHandler>, HandlerSetupError> {
    match args.handler {
        HandlerKind::Stdout => Ok(Arc::new(StdoutHandler::new())),
        HandlerKind::Http => {
            let url = args.handler_url.as_deref().ok_or(HandlerSetupError::MissingUrl)?;
            let url: url::Url = url.parse().map_err(|e| HandlerSetupError::Url(url.to_owned(), e))?;
            let config = HttpHandlerConfig {
                url,
                format: args.handler_format,
                timeout: args.handler_timeout,
                headers: headers(&args.handler_headers, std::env::vars())?,
                readiness_path: args.handler_readiness_path.clone(),
                source,
            };
            Ok(Arc::new(HttpHandler::new(config)?))
        }
    }
}

/// Headers from `NAME=VALUE` flags and `CFP_HANDLER_HEADER_<NAME>` variables of `env`.
pub fn headers(
    flags: &[String],
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, HandlerSetupError> {
    let mut headers = Vec::new();
    for flag in flags {
        let (name, value) = flag
            .split_once('=')
            .ok_or_else(|| HandlerSetupError::Header(flag.split(':').next().unwrap_or_default().to_owned()))?;
        headers.push((name.trim().to_owned(), value.to_owned()));
    }
    for (variable, value) in env {
        if let Some(name) = variable.strip_prefix(HEADER_ENV_PREFIX).filter(|n| !n.is_empty()) {
            headers.push((name.to_owned(), value));
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_come_from_flags_and_the_environment() {
        let env = vec![
            ("CFP_HANDLER_HEADER_Authorization".to_owned(), "Bearer t".to_owned()),
            ("CFP_HANDLER_HEADER_".to_owned(), "ignored".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ];
        let got = headers(&["X-Tenant=a=b".to_owned()], env).unwrap();
        assert_eq!(
            got,
            vec![
                ("X-Tenant".to_owned(), "a=b".to_owned()),
                ("Authorization".to_owned(), "Bearer t".to_owned())
            ]
        );
        let error = headers(&["Authorization: secret".to_owned()], Vec::new()).unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
