//! `cfp write`: writes generated documents (`{"id": "doc-<n>", "<pk>": "pk-<n % 64>", "n": n}`).

use futures::StreamExt;

use super::args::WriteArgs;
use crate::cosmos::{CosmosAccount, CosmosError, ErrorKind};

/// Writes the documents and prints how many were written.
pub async fn run(args: &WriteArgs) -> Result<(), CosmosError> {
    let account = CosmosAccount::connect_preferring(
        &args.connection.endpoint,
        &args.connection.account_auth(),
        &args.connection.preferred_regions,
    )
    .await?;
    let container = account
        .documents(&args.connection.database, &args.connection.container)
        .await?;
    let pk_field = match container.partition_key_paths() {
        [path]
            if path
                .strip_prefix('/')
                .is_some_and(|p| !p.is_empty() && !p.contains('/')) =>
        {
            path.trim_start_matches('/').to_owned()
        }
        other => {
            return Err(CosmosError::local(
                ErrorKind::BadRequest,
                format!("cfp write supports single top-level partition keys, not {other:?}"),
            ));
        }
    };
    let started = std::time::Instant::now();
    let results: Vec<Result<(), CosmosError>> = futures::stream::iter(args.first..args.first + args.count)
        .map(|n| {
            let container = container.clone();
            let pk_field = pk_field.clone();
            async move {
                let id = format!("doc-{n}");
                let pk = if pk_field == "id" {
                    id.clone()
                } else {
                    format!("pk-{}", n % 64)
                };
                let mut doc = serde_json::json!({"id": id, "n": n});
                doc[pk_field.as_str()] = serde_json::Value::String(pk.clone());
                container.upsert(&pk, &doc).await.map(|_| ())
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let failed: Vec<&CosmosError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if let Some(first) = failed.first() {
        return Err(CosmosError::local(
            first.kind,
            format!("{} of {} writes failed; first: {first}", failed.len(), args.count),
        ));
    }
    eprintln!("wrote {} documents in {:.2?}", args.count, started.elapsed());
    Ok(())
}
