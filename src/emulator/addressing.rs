//! Resource addressing as the service serves it, over the store's name-only paths: requests
//! addressed by resource id (`/dbs/<rid>/colls/<rid>/…`, as the Java and .NET SDKs send after
//! reading a container) are rewritten to the names the store knows, and every response names its
//! owner (`x-ms-alt-content-path`, which the Java SDK reads to keep its session tokens).

use std::collections::HashMap;
use std::sync::RwLock;

/// A request path resolved to the name-based path the store serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPath {
    /// The name-based path, without a leading or trailing slash (`dbs/db/colls/c/docs`).
    pub path: String,
    /// For a path addressed by resource id: the link its signature covers (the id of the
    /// resource, or of the parent for a feed, lower-cased as the service expects).
    pub signed_rid: Option<String>,
    /// The owner's full name, as `x-ms-alt-content-path` gives it: `dbs/db` for a container,
    /// `dbs/db/colls/c` for what a container holds; `None` for the account and databases.
    pub owner: Option<String>,
}

/// Names of the resources known by id: `dbs/<rid>` → `dbs/<name>`, and
/// `dbs/<name>/colls/<rid>` → the container's name.
#[derive(Debug, Default)]
pub struct ResourceIds {
    databases: RwLock<HashMap<String, String>>,
    containers: RwLock<HashMap<(String, String), String>>,
}

/// Whether `segment` has the shape of a resource id of `bytes` bytes (base64, `-` for `/`).
fn looks_like_rid(segment: &str, bytes: usize) -> bool {
    use base64::Engine as _;
    let standard = segment.replace('-', "/");
    base64::engine::general_purpose::STANDARD
        .decode(standard.as_bytes())
        .is_ok_and(|decoded| decoded.len() == bytes)
}

impl ResourceIds {
    /// Records the databases of the account: `(rid, name)` pairs.
    pub fn learn_databases(&self, pairs: impl IntoIterator<Item = (String, String)>) {
        let mut map = self
            .databases
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.extend(pairs);
    }

    /// Records the containers of database `database` (by name): `(rid, name)` pairs.
    pub fn learn_containers(&self, database: &str, pairs: impl IntoIterator<Item = (String, String)>) {
        let mut map = self
            .containers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.extend(pairs.into_iter().map(|(rid, name)| ((database.to_owned(), rid), name)));
    }

    fn database(&self, rid: &str) -> Option<String> {
        let map = self.databases.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(rid).cloned()
    }

    fn container(&self, database: &str, rid: &str) -> Option<String> {
        let map = self
            .containers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(database.to_owned(), rid.to_owned())).cloned()
    }

    /// What `resolve` would need to learn first: `Some(None)` for the database list,
    /// `Some(Some(db))` for the containers of `db`; `None` when the path resolves as it is.
    pub fn missing(&self, path: &str) -> Option<Option<String>> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        match segments.as_slice() {
            ["dbs", db, rest @ ..] => {
                let database = match self.database(db) {
                    Some(name) => name,
                    None if looks_like_rid(db, 4) => return Some(None),
                    None => (*db).to_owned(),
                };
                match rest {
                    ["colls", coll, ..] if self.container(&database, coll).is_none() && looks_like_rid(coll, 8) => {
                        Some(Some(database))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Resolves `path` (as sent, with or without slashes around it).
    pub fn resolve(&self, path: &str) -> ResolvedPath {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut names: Vec<String> = segments.iter().map(|s| (*s).to_owned()).collect();
        let mut last_rid: Option<&str> = None;
        if let ["dbs", db, rest @ ..] = segments.as_slice() {
            if let Some(name) = self.database(db) {
                names[1] = name;
                last_rid = Some(db);
            }
            if let ["colls", coll, ..] = rest
                && let Some(name) = self.container(&names[1], coll)
            {
                names[3] = name;
                last_rid = Some(coll);
            }
            // Deeper ids (documents, ranges) are the last id when the path ends in one.
            if last_rid.is_some() && segments.len() > 4 && segments.len().is_multiple_of(2) {
                last_rid = segments.last().copied();
            }
        }
        let owner = match names.len() {
            0..=2 => None,
            3 | 4 => Some(format!("dbs/{}", names[1])),
            _ => Some(format!("dbs/{}/colls/{}", names[1], names[3])),
        };
        ResolvedPath {
            path: names.join("/"),
            signed_rid: last_rid.map(str::to_ascii_lowercase),
            owner,
        }
    }
}

/// `(rid, id)` of each resource in a feed body such as `{"Databases":[{"_rid":…,"id":…}]}`.
pub fn rid_pairs(body: &[u8], list: &str) -> Vec<(String, String)> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    value
        .get(list)
        .and_then(serde_json::Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| {
                    Some((
                        item.get("_rid")?.as_str()?.to_owned(),
                        item.get("id")?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> ResourceIds {
        let ids = ResourceIds::default();
        ids.learn_databases([("AAAAAQ==".to_owned(), "bench".to_owned())]);
        ids.learn_containers(
            "bench",
            [
                ("AAAAAYAAAAE=".to_owned(), "items".to_owned()),
                ("AAAAAYAAAAI=".to_owned(), "leases".to_owned()),
            ],
        );
        ids
    }

    #[test]
    fn paths_by_resource_id_resolve_to_names() {
        let ids = known();
        let cases: [(&str, &str, Option<&str>, Option<&str>); 8] = [
            ("/", "", None, None),
            ("/dbs/bench", "dbs/bench", None, None),
            ("/dbs/AAAAAQ==", "dbs/bench", Some("aaaaaq=="), None),
            (
                "/dbs/AAAAAQ==/colls/AAAAAYAAAAI=/pkranges",
                "dbs/bench/colls/leases/pkranges",
                Some("aaaaayaaaai="),
                Some("dbs/bench/colls/leases"),
            ),
            (
                "dbs/AAAAAQ==/colls/AAAAAYAAAAE=/",
                "dbs/bench/colls/items",
                Some("aaaaayaaaae="),
                Some("dbs/bench"),
            ),
            (
                "/dbs/AAAAAQ==/colls/AAAAAYAAAAE=/docs/AAAAAYAAAAEBAAAAAAAAAA==",
                "dbs/bench/colls/items/docs/AAAAAYAAAAEBAAAAAAAAAA==",
                Some("aaaaayaaaaebaaaaaaaaaa=="),
                Some("dbs/bench/colls/items"),
            ),
            (
                "/dbs/bench/colls/items/docs/a",
                "dbs/bench/colls/items/docs/a",
                None,
                Some("dbs/bench/colls/items"),
            ),
            ("/dbs/other/colls/x", "dbs/other/colls/x", None, Some("dbs/other")),
        ];
        for (path, resolved, rid, owner) in cases {
            let got = ids.resolve(path);
            assert_eq!(got.path, resolved, "{path}");
            assert_eq!(got.signed_rid.as_deref(), rid, "{path}");
            assert_eq!(got.owner.as_deref(), owner, "{path}");
        }
    }

    #[test]
    fn unknown_resource_ids_ask_for_a_listing_and_names_do_not() {
        let ids = known();
        assert_eq!(ids.missing("/dbs/bench/colls/items/docs"), None);
        assert_eq!(ids.missing("/dbs/AAAAAQ==/colls/AAAAAYAAAAE=/pkranges"), None);
        assert_eq!(ids.missing("/dbs/AAAAAg=="), Some(None));
        assert_eq!(
            ids.missing("/dbs/AAAAAQ==/colls/AAAAAYAAAAM="),
            Some(Some("bench".into()))
        );
        assert_eq!(ids.missing("/dbs/bench/colls/AAAAAYAAAAM="), Some(Some("bench".into())));
        assert_eq!(ids.missing("/dbs/mydb/colls/orders"), None);
        assert_eq!(ids.missing("/"), None);
    }

    #[test]
    fn feed_bodies_give_their_resource_ids() {
        let body = br#"{"Databases":[{"_rid":"AAAAAQ==","id":"bench"},{"id":"no-rid"}],"_count":2}"#;
        assert_eq!(
            rid_pairs(body, "Databases"),
            vec![("AAAAAQ==".to_owned(), "bench".to_owned())]
        );
        assert!(rid_pairs(b"not json", "Databases").is_empty());
    }
}
