//! Request authorization as the service checks it, for `cfp emulator` over HTTP: by default any
//! signature passes (as in the SDK's in-memory emulator); with an account key, requests must carry
//! that key's signature (`type=master`); with key auth disabled, only one Entra ID token
//! (`type=aad`) passes. In-process clients are never checked.

use std::sync::Arc;

use azure_core::credentials::Secret;

use crate::http_server::Response;

/// Which requests the account accepts.
#[derive(Clone, Default)]
pub enum RequiredAuth {
    /// Any signature (the SDK emulator's behaviour).
    #[default]
    Any,
    /// Requests signed with this account key.
    Key(Arc<Secret>),
    /// Key auth disabled (`disableLocalAuth`): requests carrying this Entra ID token.
    EntraToken(Arc<str>),
}

/// The parts of a request its authorization covers.
pub struct SignedRequest<'a> {
    /// The HTTP method.
    pub method: &'a str,
    /// The request path, such as `/dbs/db/colls/items/docs`.
    pub path: &'a str,
    /// For a path addressed by resource id, the lower-cased id the signature covers instead of
    /// the path (`/dbs/<rid>/colls/<rid>/pkranges` → the container's id).
    pub signed_rid: Option<&'a str>,
    /// The `Authorization` header (percent-encoded, as sent).
    pub authorization: &'a str,
    /// The `x-ms-date` header.
    pub date: &'a str,
}

impl RequiredAuth {
    /// The 401 the service answers for `request`; `None` when it may pass.
    pub fn refuse(&self, request: &SignedRequest<'_>) -> Option<Response> {
        let message = match self {
            RequiredAuth::Any => return None,
            RequiredAuth::EntraToken(expected) => match kind_and_signature(request.authorization) {
                (Some(kind), Some(token)) if kind == "aad" && token == expected.as_ref() => return None,
                (Some(kind), _) if kind == "aad" => "The AAD token in the request is not valid for this account.",
                _ => "Local Authorization is disabled. Use an AAD token to authorize all requests.",
            },
            RequiredAuth::Key(key) => match kind_and_signature(request.authorization) {
                (Some(kind), Some(signature))
                    if kind == "master" && expected_signature(key, request).is_some_and(|e| e == signature) =>
                {
                    return None;
                }
                (Some(kind), _) if kind == "aad" => {
                    "Microsoft Entra ID tokens are not accepted by this emulator; sign with the account key."
                }
                _ => {
                    "The input authorization token can't serve the request. The wrong key is being used or the expected payload is not built as per the protocol."
                }
            },
        };
        Some(crate::http_server::json(
            401,
            &serde_json::json!({"code": "Unauthorized", "message": message}),
        ))
    }
}

/// The `type` and `sig` of an Authorization header (`type=master&ver=1.0&sig=<signature>`,
/// percent-encoded as a whole).
fn kind_and_signature(authorization: &str) -> (Option<String>, Option<String>) {
    let decoded: String = url::form_urlencoded::parse(format!("h={authorization}").as_bytes())
        .map(|(_, value)| value.into_owned())
        .collect();
    let (mut kind, mut signature) = (None, None);
    for (name, value) in decoded.split('&').filter_map(|field| field.split_once('=')) {
        match name {
            "type" => kind = Some(value.to_owned()),
            "sig" => signature = Some(value.to_owned()),
            _ => {}
        }
    }
    (kind, signature)
}

/// The master-key signature of a request: HMAC-SHA256 over
/// `verb\nresourceType\nresourceLink\ndate\n\n`, the resource type and link read from the path
/// (`/dbs/db/colls/c/docs` → `docs`, `dbs/db/colls/c`; `/dbs/db/colls/c/docs/id` → `docs`, the
/// whole path). `None` when the key cannot sign (not base64): such a key refuses everything.
fn expected_signature(key: &Secret, request: &SignedRequest<'_>) -> Option<String> {
    let segments: Vec<&str> = request.path.split('/').filter(|s| !s.is_empty()).collect();
    let (resource_type, mut link) = if segments.len() % 2 == 1 {
        (segments[segments.len() - 1], segments[..segments.len() - 1].join("/"))
    } else if segments.is_empty() {
        ("", String::new())
    } else {
        (segments[segments.len() - 2], segments.join("/"))
    };
    if let Some(rid) = request.signed_rid {
        link = rid.to_owned();
    }
    let payload = format!(
        "{}\n{}\n{}\n{}\n\n",
        request.method.to_ascii_lowercase(),
        resource_type.to_ascii_lowercase(),
        link,
        request.date.to_ascii_lowercase()
    );
    azure_core::hmac::hmac_sha256(&payload, key).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(key: &str, method: &str, resource_type: &str, link: &str) -> String {
        let date = "Mon, 23 Nov 2026 05:00:00 GMT";
        let payload = format!("{method}\n{resource_type}\n{link}\n{}\n\n", date.to_ascii_lowercase());
        let signature = azure_core::hmac::hmac_sha256(&payload, &Secret::new(key.to_owned())).unwrap();
        url::form_urlencoded::byte_serialize(format!("type=master&ver=1.0&sig={signature}").as_bytes()).collect()
    }

    #[test]
    fn master_key_signatures_are_checked_per_resource() {
        let key = crate::cosmos::EMULATOR_KEY;
        let required = RequiredAuth::Key(Arc::new(Secret::new(key.to_owned())));
        let date = "Mon, 23 Nov 2026 05:00:00 GMT";
        let cases = [
            ("GET", "/", "", ""),
            ("GET", "/dbs/db", "dbs", "dbs/db"),
            ("POST", "/dbs/db/colls/items/docs", "docs", "dbs/db/colls/items"),
            (
                "PUT",
                "/dbs/db/colls/items/docs/doc-1",
                "docs",
                "dbs/db/colls/items/docs/doc-1",
            ),
            ("GET", "/dbs/db/colls/items/pkranges", "pkranges", "dbs/db/colls/items"),
        ];
        for (method, path, resource_type, link) in cases {
            let good = signed(key, &method.to_ascii_lowercase(), resource_type, link);
            let request = SignedRequest {
                method,
                path,
                signed_rid: None,
                authorization: &good,
                date,
            };
            assert!(
                required.refuse(&request).is_none(),
                "{method} {path} refused with the right key"
            );
            let other = signed("b3RoZXIta2V5", &method.to_ascii_lowercase(), resource_type, link);
            let request = SignedRequest {
                method,
                path,
                signed_rid: None,
                authorization: &other,
                date,
            };
            assert_eq!(
                required.refuse(&request).map(|r| r.status()),
                Some(hyper::StatusCode::UNAUTHORIZED)
            );
        }
        let anything = SignedRequest {
            method: "GET",
            path: "/",
            signed_rid: None,
            authorization: "",
            date,
        };
        assert!(RequiredAuth::Any.refuse(&anything).is_none());
    }
}
