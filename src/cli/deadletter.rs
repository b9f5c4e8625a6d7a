//! `cfp deadletter list|replay`: a processor's dead-lettered documents, and sending them to the
//! handler again (each one it accepts is removed; the others stay).

use std::fmt::Write as _;

use super::args::{DeadLetterArgs, DeadLetterCommand, DeadLetterReplayArgs, OutputFormat};
use crate::cosmos::{CosmosAccount, EpkRange, ProvisionError};
use crate::processor::{Batch, CosmosDeadLetters, DeadLetter};

/// Why `cfp deadletter` failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The account or container could not be reached.
    #[error("{0}")]
    Open(String),
    /// The handler flags cannot work.
    #[error(transparent)]
    Handler(#[from] super::handler::HandlerSetupError),
    /// Some dead letters were not accepted by the handler.
    #[error("{failed} of {total} dead letters were not accepted by the handler and stay in the container")]
    NotReplayed {
        /// Not accepted.
        failed: usize,
        /// Tried.
        total: usize,
    },
}

async fn open(args: &DeadLetterArgs) -> Result<(CosmosAccount, CosmosDeadLetters), DeadLetterError> {
    let account = CosmosAccount::connect(&args.endpoint, &args.auth.with_key(&args.key))
        .await
        .map_err(|e| DeadLetterError::Open(format!("cannot connect to {}: {e}", args.endpoint)))?;
    let name = format!("{}/{}", args.dead_letter_database, args.dead_letter_container);
    // Read only: a missing container is reported with the command that creates it, never created.
    let container = account
        .open_or_create(&args.dead_letter_database, &args.dead_letter_container, "/id", false)
        .await
        .map_err(|e| match e {
            ProvisionError::Missing { .. } => DeadLetterError::Open(format!("dead-letter container: {e}")),
            _ => DeadLetterError::Open(format!("opening the dead-letter container {name}: {e}")),
        })?;
    Ok((account, CosmosDeadLetters::new(container)))
}

/// Runs `cfp deadletter ...`.
pub async fn run(command: &DeadLetterCommand) -> Result<(), DeadLetterError> {
    match command {
        DeadLetterCommand::List(args) => {
            let (_, letters) = open(args).await?;
            let list = letters
                .list(&args.processor)
                .await
                .map_err(|e| DeadLetterError::Open(format!("listing dead letters: {e}")))?;
            match args.output {
                OutputFormat::Json => super::print_out(format_args!(
                    "{}\n",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                )),
                OutputFormat::Table => super::print_out(table(&args.processor, &list)),
            }
            Ok(())
        }
        DeadLetterCommand::Replay(args) => replay(args).await,
    }
}

/// The dead letters as a table for people.
pub fn table(processor: &str, letters: &[DeadLetter]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "DEAD LETTER\tDOCUMENT\tLEASE\tATTEMPTS\tLAST FAILURE\tERROR");
    for letter in letters {
        let document = letter
            .document
            .get("id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("-");
        let when = letter
            .last_failure
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let error: String = letter.error.chars().take(120).collect();
        let _ = writeln!(
            out,
            "{}\t{document}\t{}\t{}\t{when}\t{error}",
            letter.id, letter.lease, letter.attempts
        );
    }
    let _ = writeln!(
        out,
        "processor {processor}: {} dead-lettered document(s)",
        letters.len()
    );
    out
}

async fn replay(args: &DeadLetterReplayArgs) -> Result<(), DeadLetterError> {
    let (account, letters) = open(&args.letters).await?;
    // Replayed events come from the dead-letter container.
    let source = super::worker::event_source(
        &account,
        &args.letters.dead_letter_database,
        &args.letters.dead_letter_container,
    );
    let handler = super::handler::build(&args.handler, source).map_err(DeadLetterError::Handler)?;
    let list = letters
        .list(&args.letters.processor)
        .await
        .map_err(|e| DeadLetterError::Open(format!("listing dead letters: {e}")))?;
    let mut failed = 0;
    for letter in &list {
        let range = match letter.lease.split_once('-') {
            Some((min, max)) => EpkRange::new(min, max),
            None => EpkRange::full(),
        };
        let batch_id = format!("replay.{}", letter.id);
        let documents = std::slice::from_ref(&letter.document);
        let batch = Batch {
            processor: &letter.processor,
            lease_token: &letter.lease,
            feed_range: &range,
            batch_id: &batch_id,
            attempt: letter.attempts + 1,
            documents,
            changes: letter.change.as_slice(),
        };
        match handler.handle(batch).await {
            Ok(()) => match letters.remove(&letter.id).await {
                Ok(()) => eprintln!("{}", replayed(&letter.id, &letter.document)),
                Err(error) => {
                    failed += 1;
                    eprintln!(
                        "replayed {} but removing it failed (it may be replayed again): {error}",
                        letter.id
                    );
                }
            },
            Err(error) => {
                failed += 1;
                eprintln!("not replayed {}: {error}", letter.id);
            }
        }
    }
    eprintln!(
        "processor {}: {} of {} dead letters replayed",
        args.letters.processor,
        list.len() - failed,
        list.len()
    );
    if failed > 0 {
        return Err(DeadLetterError::NotReplayed {
            failed,
            total: list.len(),
        });
    }
    Ok(())
}

/// The line for a dead letter replayed: its id and its document's id, as they are written.
fn replayed(letter: &str, document: &serde_json::Value) -> String {
    match document.get("id") {
        Some(serde_json::Value::String(id)) => format!("replayed {letter} (document {id})"),
        Some(id) => format!("replayed {letter} (document {id})"),
        None => format!("replayed {letter}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_replayed_letter_is_named_with_its_document_as_written() {
        let cases = [
            (json!({"id": "doc-7", "pk": "a"}), "replayed doc-7.1 (document doc-7)"),
            (json!({"id": 7}), "replayed doc-7.1 (document 7)"),
            (json!({"pk": "a"}), "replayed doc-7.1"),
        ];
        for (document, line) in cases {
            assert_eq!(super::replayed("doc-7.1", &document), line);
        }
    }
}
