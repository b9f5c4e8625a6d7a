//! Opening the containers the processor keeps its own documents in (leases, dead letters): read
//! first, and create only what is missing and may be created. Data-plane identities (every
//! Microsoft Entra ID token, and keys of accounts with `disableKeyBasedMetadataWriteAccess`) may
//! not create databases or containers; such an account answers 403, and an existing container
//! must then be used as it is.

use super::client::CosmosAccount;
use super::documents::DocumentContainer;
use super::error::{ErrorKind, ProvisionError};

impl CosmosAccount {
    /// Opens `database/container`. When it does not exist and `create` allows it, creates it
    /// (and the database when that is missing too) with `partition_key_path`; an existing
    /// container is never written to, whatever `create` says.
    pub async fn open_or_create(
        &self,
        database: &str,
        container: &str,
        partition_key_path: &str,
        create: bool,
    ) -> Result<DocumentContainer, ProvisionError> {
        match self.documents(database, container).await {
            Ok(documents) => return Ok(documents),
            Err(error) if error.kind == ErrorKind::NotFound => {}
            // The SDK's container cache can outlive the container (an account that came back
            // empty answers 503/20305 from a stale resource id): ask the database which exist.
            Err(error) => match self.container_exists(database, container).await {
                Ok(false) => {}
                _ => return Err(error.into()),
            },
        }
        let database_missing = !self.database_exists(database).await?;
        let how_to_create = create_commands(self.host(), database, container, partition_key_path, database_missing);
        let name = format!("{database}/{container}");
        if !create {
            return Err(ProvisionError::Missing { name, how_to_create });
        }
        match self
            .create_missing(database, database_missing, container, partition_key_path)
            .await
        {
            Ok(()) => {}
            Err(source) if source.kind == ErrorKind::Forbidden => {
                return Err(ProvisionError::CreationRefused {
                    name,
                    how_to_create,
                    source,
                });
            }
            Err(error) => return Err(error.into()),
        }
        Ok(self.documents(database, container).await?)
    }
}

/// The Azure CLI commands that create `database/container` on the account at `host` (the
/// database first when it is missing). The account name is the host's first label on the
/// service (`acct.documents.azure.com` → `acct`), else a placeholder.
pub fn create_commands(
    host: &str,
    database: &str,
    container: &str,
    partition_key_path: &str,
    database_missing: bool,
) -> String {
    let account = account_name(host).unwrap_or("<account>");
    let common = format!("--account-name {account} --resource-group <resource-group>");
    let container_command = format!(
        "az cosmosdb sql container create {common} --database-name {} --name {} --partition-key-path {}",
        shell_word(database),
        shell_word(container),
        shell_word(partition_key_path)
    );
    if database_missing {
        format!(
            "az cosmosdb sql database create {common} --name {} && {container_command}",
            shell_word(database)
        )
    } else {
        container_command
    }
}

/// The account name in a service host name (`acct.documents.azure.com`, also the sovereign
/// clouds' `documents.azure.us` / `documents.azure.cn`).
fn account_name(host: &str) -> Option<&str> {
    let (first, rest) = host.split_once('.')?;
    (rest.starts_with("documents.") && !first.is_empty()).then_some(first)
}

/// `word` as one shell word: as it is when it holds only safe characters, else single-quoted.
fn shell_word(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '@'));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_commands_name_the_account_database_and_container() {
        let table = [
            (
                "acct.documents.azure.com",
                "db",
                "leases",
                false,
                "az cosmosdb sql container create --account-name acct --resource-group <resource-group> --database-name db --name leases --partition-key-path /id",
            ),
            (
                "gov.documents.azure.us",
                "db",
                "leases",
                true,
                "az cosmosdb sql database create --account-name gov --resource-group <resource-group> --name db && az cosmosdb sql container create --account-name gov --resource-group <resource-group> --database-name db --name leases --partition-key-path /id",
            ),
            (
                "127.0.0.1",
                "my db",
                "it's",
                false,
                "az cosmosdb sql container create --account-name <account> --resource-group <resource-group> --database-name 'my db' --name 'it'\\''s' --partition-key-path /id",
            ),
            (
                "localhost",
                "db",
                "leases",
                false,
                "az cosmosdb sql container create --account-name <account> --resource-group <resource-group> --database-name db --name leases --partition-key-path /id",
            ),
        ];
        for (host, database, container, database_missing, want) in table {
            assert_eq!(
                create_commands(host, database, container, "/id", database_missing),
                want,
                "{host} {database}/{container}"
            );
        }
    }
}
