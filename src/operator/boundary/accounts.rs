//! Which accounts the operator may reach for a namespace: the cluster admin's allow-list. The
//! operator signs in with its own identity for every namespace that may write a resource, so an
//! endpoint a resource names is reached with that identity only where the admin listed it for
//! the resource's namespace; plain http (a development emulator) only where the admin listed it
//! too. A tenant's own key over https needs no entry: the key is the tenant's. Pure; the file is
//! read by [`AllowListFile`].

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Deserialize;

/// An account endpoint as the allow-list compares it: scheme, host (lower case) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// `https` or `http`.
    pub scheme: Scheme,
    /// The host, lower case.
    pub host: String,
    /// The port (the scheme's default when the URL gives none).
    pub port: u16,
}

/// The scheme of an account endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// TLS.
    Https,
    /// Plain http: only where the admin allowed it.
    Http,
}

/// Why a text is not an account endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Not a URL at all.
    #[error("endpoint {0:?} is not a URL")]
    NotUrl(String),
    /// Neither https nor http.
    #[error("endpoint {0:?} must use https (or http where the cluster admin allowed it)")]
    Scheme(String),
    /// A user name or password in the URL.
    #[error("endpoint {0:?} must not carry a user name or password")]
    UserInfo(String),
    /// A path, query or fragment beyond `/`.
    #[error("endpoint {0:?} must be an account's address alone (scheme, host, port)")]
    Path(String),
}

impl Endpoint {
    /// Parses and normalises `text` (`https://Acct.documents.azure.com/` →
    /// `https://acct.documents.azure.com:443/`).
    pub fn parse(text: &str) -> Result<Self, EndpointError> {
        let url = url::Url::parse(text.trim()).map_err(|_| EndpointError::NotUrl(text.to_owned()))?;
        let scheme = match url.scheme() {
            "https" => Scheme::Https,
            "http" => Scheme::Http,
            _ => return Err(EndpointError::Scheme(text.to_owned())),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EndpointError::UserInfo(text.to_owned()));
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(EndpointError::Path(text.to_owned()));
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(EndpointError::NotUrl(text.to_owned()));
        };
        Ok(Self {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Https => "https",
            Scheme::Http => "http",
        };
        write!(f, "{scheme}://{}:{}/", self.host, self.port)
    }
}

/// One entry of the allow-list file: an account endpoint and the namespaces whose resources may
/// have the operator reach it with its own identity (`"*"`: every namespace).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowedAccount {
    /// The account endpoint (`https://acct.documents.azure.com:443/`; `http://…` allows plain
    /// http to it).
    pub endpoint: String,
    /// The namespaces that may use it.
    pub namespaces: Vec<String>,
}

/// The namespaces of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Namespaces {
    Every,
    Only(BTreeSet<String>),
}

impl Namespaces {
    fn admit(&self, namespace: &str) -> bool {
        match self {
            Namespaces::Every => true,
            Namespaces::Only(names) => names.contains(namespace),
        }
    }
}

/// How the operator would sign in at an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignIn {
    /// With its own identity (workload or managed identity): the allow-list decides.
    OwnIdentity,
    /// With the resource's own key: allowed over https; plain http only where listed.
    TenantKey,
}

/// Why the operator may not reach an endpoint for a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAllowed {
    /// The endpoint is not an account's address.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The allow-list names no such entry.
    #[error(
        "the operator may not {what} at {endpoint} for namespace {namespace:?}: the cluster admin must add {{endpoint: {endpoint}, namespaces: [{namespace}]}} to the operator's allowed accounts (chart value allowedAccounts)"
    )]
    NotListed {
        /// What would be sent there.
        what: &'static str,
        /// The endpoint, normalised.
        endpoint: Endpoint,
        /// The resource's namespace.
        namespace: String,
    },
    /// The allow-list file could not be read: nothing that needs it is allowed.
    #[error("the operator's allowed accounts cannot be read ({0}): the cluster admin must fix that file")]
    Unreadable(String),
}

/// Why an allow-list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    /// Not the YAML list of entries.
    #[error("not a list of {{endpoint, namespaces}} entries: {0}")]
    Format(String),
    /// An entry's endpoint.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
}

/// The accounts the operator may reach, per namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<(Endpoint, Namespaces)>,
}

impl AllowList {
    /// The allow-list of `entries`.
    pub fn new(entries: &[AllowedAccount]) -> Result<Self, AllowListError> {
        let mut list = Self::default();
        for entry in entries {
            let namespaces = if entry.namespaces.iter().any(|n| n == "*") {
                Namespaces::Every
            } else {
                Namespaces::Only(entry.namespaces.iter().map(|n| n.trim().to_owned()).collect())
            };
            list.entries.push((Endpoint::parse(&entry.endpoint)?, namespaces));
        }
        Ok(list)
    }

    /// Parses the allow-list file's YAML (a list of entries; empty: nothing listed).
    pub fn from_yaml(text: &str) -> Result<Self, AllowListError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let entries: Vec<AllowedAccount> =
            serde_yaml::from_str(text).map_err(|e| AllowListError::Format(e.to_string()))?;
        Self::new(&entries)
    }

    /// Whether a resource in `namespace` may have the operator sign in with `sign_in` at
    /// `endpoint`.
    pub fn allows(&self, endpoint: &str, namespace: &str, sign_in: SignIn) -> Result<(), NotAllowed> {
        let endpoint = Endpoint::parse(endpoint)?;
        let what = match (sign_in, endpoint.scheme) {
            (SignIn::OwnIdentity, _) => "use its own identity",
            (SignIn::TenantKey, Scheme::Http) => "send requests over plain http",
            (SignIn::TenantKey, Scheme::Https) => return Ok(()),
        };
        let listed = self
            .entries
            .iter()
            .any(|(allowed, namespaces)| *allowed == endpoint && namespaces.admit(namespace));
        if listed {
            return Ok(());
        }
        Err(NotAllowed::NotListed {
            what,
            endpoint,
            namespace: namespace.to_owned(),
        })
    }
}

/// The allow-list as its file says now: read again whenever the file changed (a mounted
/// ConfigMap is updated in place), so the admin's edits take effect without a restart. No file
/// configured: nothing is listed.
#[derive(Debug, Default)]
pub struct AllowListFile {
    path: Option<PathBuf>,
    read: Mutex<Option<FileRead>>,
}

/// The file as last read: when it was modified then, and what it held (or why not).
#[derive(Debug)]
struct FileRead {
    modified: Option<SystemTime>,
    list: Result<AllowList, String>,
}

impl AllowListFile {
    /// The allow-list kept in `path` (`None`: an empty list).
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            read: Mutex::new(None),
        }
    }

    /// The list now, or why the file cannot be read.
    pub fn current(&self) -> Result<AllowList, NotAllowed> {
        let Some(path) = &self.path else {
            return Ok(AllowList::default());
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let mut read = self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let stale = read
            .as_ref()
            .is_none_or(|r| modified.is_none() || r.modified != modified);
        if stale {
            let list = std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|text| AllowList::from_yaml(&text).map_err(|e| format!("{}: {e}", path.display())));
            *read = Some(FileRead { modified, list });
        }
        match read.as_ref().map(|r| r.list.clone()) {
            Some(Ok(list)) => Ok(list),
            Some(Err(why)) => Err(NotAllowed::Unreadable(why)),
            None => Ok(AllowList::default()),
        }
    }

    /// Whether `namespace` may have the operator sign in with `sign_in` at `endpoint`.
    pub fn allows(&self, endpoint: &str, namespace: &str, sign_in: SignIn) -> Result<(), NotAllowed> {
        match (self.current(), sign_in) {
            (Ok(list), _) => list.allows(endpoint, namespace, sign_in),
            // Key auth over https needs no list.
            (Err(_), SignIn::TenantKey) if AllowList::default().allows(endpoint, namespace, sign_in).is_ok() => Ok(()),
            (Err(why), _) => Err(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_compared_by_scheme_host_and_port() {
        let cases = [
            (
                "https://Acct.Documents.Azure.com/",
                Ok("https://acct.documents.azure.com:443/"),
            ),
            (
                "https://acct.documents.azure.com:443",
                Ok("https://acct.documents.azure.com:443/"),
            ),
            ("http://127.0.0.1:8081/", Ok("http://127.0.0.1:8081/")),
            ("http://emulator.dev.svc", Ok("http://emulator.dev.svc:80/")),
            ("https://user:pw@acct.documents.azure.com/", Err("user name")),
            ("https://acct.documents.azure.com/other", Err("address alone")),
            ("https://acct.documents.azure.com/?x=1", Err("address alone")),
            ("ftp://acct.documents.azure.com/", Err("must use https")),
            ("acct.documents.azure.com", Err("not a URL")),
        ];
        for (text, want) in cases {
            let got = Endpoint::parse(text).map(|e| e.to_string()).map_err(|e| e.to_string());
            match want {
                Ok(normal) => assert_eq!(got.as_deref(), Ok(normal), "{text}"),
                Err(part) => assert!(got.as_ref().is_err_and(|e| e.contains(part)), "{text}: {got:?}"),
            }
        }
    }

    fn list() -> AllowList {
        AllowList::from_yaml(
            "- endpoint: https://orders.documents.azure.com:443/\n  namespaces: [team-a]\n- endpoint: http://cosmos-emulator.dev.svc:8081\n  namespaces: ['*']\n",
        )
        .unwrap()
    }

    #[test]
    fn the_operator_s_identity_goes_only_where_the_admin_listed_the_namespace() {
        use SignIn::{OwnIdentity, TenantKey};
        let cases = [
            ("https://orders.documents.azure.com/", "team-a", OwnIdentity, true),
            ("https://ORDERS.documents.azure.com:443", "team-a", OwnIdentity, true),
            ("https://orders.documents.azure.com/", "team-b", OwnIdentity, false),
            ("https://orders.documents.azure.com:444/", "team-a", OwnIdentity, false),
            ("http://orders.documents.azure.com:443/", "team-a", OwnIdentity, false),
            (
                "https://orders.documents.azure.com.evil.example/",
                "team-a",
                OwnIdentity,
                false,
            ),
            ("http://cosmos-emulator.dev.svc:8081/", "anyone", OwnIdentity, true),
            ("http://cosmos-emulator.dev.svc:8081/", "anyone", TenantKey, true),
            ("http://listener.tenant-a.svc:8081/", "tenant-a", TenantKey, false),
            ("https://anything.example/", "tenant-a", TenantKey, true),
            ("https://anything.example/", "tenant-a", OwnIdentity, false),
        ];
        for (endpoint, namespace, sign_in, allowed) in cases {
            let got = list().allows(endpoint, namespace, sign_in);
            assert_eq!(got.is_ok(), allowed, "{endpoint} {namespace} {sign_in:?}: {got:?}");
        }
    }

    #[test]
    fn a_refusal_says_what_the_admin_must_add() {
        let refused = list()
            .allows("https://payments.documents.azure.com/", "team-b", SignIn::OwnIdentity)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("{endpoint: https://payments.documents.azure.com:443/, namespaces: [team-b]}")
                && refused.contains("allowedAccounts"),
            "{refused}"
        );
    }

    #[test]
    fn an_unreadable_file_allows_only_what_needs_no_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowed.yaml");
        std::fs::write(&path, "endpoint: not-a-list").unwrap();
        let file = AllowListFile::new(Some(path.clone()));
        let identity = file.allows("https://orders.documents.azure.com/", "team-a", SignIn::OwnIdentity);
        assert!(matches!(identity, Err(NotAllowed::Unreadable(_))), "{identity:?}");
        assert!(file.allows("https://x.example/", "team-a", SignIn::TenantKey).is_ok());
        assert!(file.allows("http://x.example/", "team-a", SignIn::TenantKey).is_err());
        std::fs::write(
            &path,
            "- endpoint: https://orders.documents.azure.com/\n  namespaces: [team-a]\n",
        )
        .unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(later))
            .unwrap();
        assert!(
            file.allows("https://orders.documents.azure.com/", "team-a", SignIn::OwnIdentity)
                .is_ok(),
            "read again"
        );
        assert!(
            AllowListFile::new(None)
                .allows("https://x.example/", "a", SignIn::OwnIdentity)
                .is_err()
        );
    }
}
