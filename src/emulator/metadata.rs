//! Metadata writes as the service refuses them: data-plane identities (Microsoft Entra ID tokens)
//! may never create, replace or delete databases and containers — the service answers 403 with
//! sub-status 5301 naming the RBAC action — and neither may account keys once
//! `disableKeyBasedMetadataWriteAccess` is set (403, naming the operation).

use crate::http_server::Response;

/// A write to a database or container resource (not to what a container holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataWrite {
    /// The data-plane RBAC action it needs, such as
    /// `Microsoft.DocumentDB/databaseAccounts/sqlDatabases/write`.
    pub action: &'static str,
    /// The resource type in the service's words: `dbs` or `colls`.
    pub resource_type: &'static str,
}

/// The metadata write a request is, from its method and name-based path (`dbs`, `dbs/db`,
/// `dbs/db/colls`, `dbs/db/colls/c`); `None` for reads and for documents, feeds and the like.
pub fn metadata_write(method: &str, path: &str) -> Option<MetadataWrite> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (database_level, verb) = match (method, segments.as_slice()) {
        ("POST", ["dbs"]) => (true, "write"),
        ("PUT", ["dbs", _]) => (true, "write"),
        ("DELETE", ["dbs", _]) => (true, "delete"),
        ("POST", ["dbs", _, "colls"]) => (false, "write"),
        ("PUT", ["dbs", _, "colls", _]) => (false, "write"),
        ("DELETE", ["dbs", _, "colls", _]) => (false, "delete"),
        _ => return None,
    };
    let action = match (database_level, verb) {
        (true, "write") => "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/write",
        (true, _) => "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/delete",
        (false, "write") => "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/write",
        (false, _) => "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/delete",
    };
    Some(MetadataWrite {
        action,
        resource_type: if database_level { "dbs" } else { "colls" },
    })
}

/// The service's answer to a metadata write by a Microsoft Entra ID token: 403/5301.
pub fn refused_to_token(write: MetadataWrite, path: &str) -> Response {
    let message = format!(
        "Request blocked by Auth emulator : Request is blocked because principal does not have required RBAC permissions to perform action [{}] on resource [{path}].",
        write.action
    );
    forbidden(Some(5301), &message)
}

/// The service's answer to a metadata write signed with a key on an account with
/// `disableKeyBasedMetadataWriteAccess`: 403.
pub fn refused_to_key(method: &str, write: MetadataWrite) -> Response {
    let message = format!(
        "Operation '{method}' on resource '{}' is not allowed through Azure Cosmos DB endpoint. Please switch on such operations for your account, or perform this operation through Azure Resource Manager, Azure Portal, Azure CLI or Azure Powershell",
        write.resource_type
    );
    forbidden(None, &message)
}

fn forbidden(sub_status: Option<u32>, message: &str) -> Response {
    let mut response = crate::http_server::json(403, &serde_json::json!({"code": "Forbidden", "message": message}));
    if let Some(sub_status) = sub_status {
        response
            .headers_mut()
            .insert("x-ms-substatus", hyper::header::HeaderValue::from(sub_status));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_writes_are_told_from_data_requests() {
        let table = [
            ("POST", "dbs", Some("sqlDatabases/write")),
            ("PUT", "dbs/db", Some("sqlDatabases/write")),
            ("DELETE", "dbs/db", Some("sqlDatabases/delete")),
            ("POST", "dbs/db/colls", Some("sqlDatabases/containers/write")),
            ("PUT", "dbs/db/colls/leases", Some("sqlDatabases/containers/write")),
            ("DELETE", "dbs/db/colls/leases", Some("sqlDatabases/containers/delete")),
            ("GET", "dbs", None),
            ("GET", "dbs/db/colls/leases", None),
            ("POST", "dbs/db/colls/leases/docs", None),
            ("PUT", "dbs/db/colls/leases/docs/x", None),
            ("DELETE", "dbs/db/colls/leases/docs/x", None),
            ("GET", "dbs/db/colls/leases/pkranges", None),
        ];
        for (method, path, want) in table {
            let got = metadata_write(method, path)
                .map(|w| w.action.trim_start_matches("Microsoft.DocumentDB/databaseAccounts/"));
            assert_eq!(got, want, "{method} {path}");
        }
    }

    #[test]
    fn refusals_carry_403_and_the_token_case_its_sub_status() {
        let write = metadata_write("POST", "dbs/db/colls").unwrap();
        let token = refused_to_token(write, "dbs/db/colls");
        assert_eq!(token.status().as_u16(), 403);
        assert_eq!(token.headers().get("x-ms-substatus").unwrap(), "5301");
        let key = refused_to_key("POST", write);
        assert_eq!(key.status().as_u16(), 403);
        assert!(key.headers().get("x-ms-substatus").is_none());
    }
}
