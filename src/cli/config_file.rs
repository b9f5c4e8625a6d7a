//! The worker's config file: a YAML map from flag names to values, applied where neither a flag
//! nor an environment variable gave a value.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};

use super::args::Cli;

/// Why the config file could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a YAML map of flag names to values.
    #[error("config file {path}: {reason}")]
    Invalid {
        /// The path.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Parses the command line; when the subcommand has a `--config` file, its values fill in the
/// flags that were given neither on the command line nor in the environment.
pub fn parse<I, T>(args: I) -> Result<Cli, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = Cli::command();
    // First pass only to find the config file: required flags may come from the file itself.
    let probe = command.clone().ignore_errors(true).try_get_matches_from(&args);
    let config = probe.as_ref().ok().and_then(|matches| {
        let (name, sub) = matches.subcommand()?;
        let path = sub.try_get_one::<std::path::PathBuf>("config").ok().flatten()?;
        Some((name.to_owned(), sub.clone(), path.clone()))
    });
    let Some((name, sub, path)) = config else {
        let matches = command.try_get_matches_from(&args).map_err(ParseError::Clap)?;
        return Cli::from_arg_matches(&matches).map_err(ParseError::Clap);
    };
    let (name, sub, path) = (name.as_str(), &sub, &path);
    let extra = config_args(&command, name, sub, path).map_err(ParseError::Config)?;
    let mut merged = args;
    merged.extend(extra);
    let matches = command.try_get_matches_from(&merged).map_err(ParseError::Clap)?;
    Cli::from_arg_matches(&matches).map_err(ParseError::Clap)
}

/// A command line or config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Reported by clap (includes --help and --version).
    #[error(transparent)]
    Clap(clap::Error),
    /// The config file is unusable.
    #[error(transparent)]
    Config(ConfigFileError),
}

fn config_args(
    command: &Command,
    name: &str,
    matches: &ArgMatches,
    path: &Path,
) -> Result<Vec<OsString>, ConfigFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: shown.clone(),
        source,
    })?;
    let invalid = |reason: String| ConfigFileError::Invalid {
        path: shown.clone(),
        reason,
    };
    let map: serde_yaml::Mapping = serde_yaml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let sub = command
        .find_subcommand(name)
        .ok_or_else(|| invalid(format!("unknown subcommand {name}")))?;
    let mut out = Vec::new();
    for (key, value) in map {
        let key = key
            .as_str()
            .ok_or_else(|| invalid("keys must be flag names".into()))?
            .to_owned();
        let arg = sub
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && a.get_id() != "config")
            .ok_or_else(|| {
                invalid(format!(
                    "unknown setting {key:?} (use the flag names of `cfp {name} --help`)"
                ))
            })?;
        let id = arg.get_id().as_str();
        if !matches!(matches.value_source(id), None | Some(ValueSource::DefaultValue)) {
            continue;
        }
        let flag = format!("--{key}");
        let takes_value = arg.get_action().takes_values();
        match value {
            serde_yaml::Value::Bool(true) if !takes_value => out.push(flag.into()),
            serde_yaml::Value::Bool(false) if !takes_value => {}
            serde_yaml::Value::String(s) => out.extend([flag.into(), s.into()]),
            serde_yaml::Value::Number(n) => out.extend([flag.into(), n.to_string().into()]),
            serde_yaml::Value::Bool(b) => out.extend([flag.into(), b.to_string().into()]),
            _ => return Err(invalid(format!("{key}: expected a string, number or boolean"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    fn worker(args: &[&str]) -> Box<crate::cli::args::WorkerArgs> {
        match parse(args.iter().copied()).unwrap().command {
            Command::Worker(w) => w,
            other => panic!("not a worker: {other:?}"),
        }
    }

    #[test]
    fn config_file_fills_in_but_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.yaml");
        std::fs::write(
            &path,
            "lease-expiration: 30s\nmax-items: 7\nprocessor: from-file\nno-create-leases: true\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let w = worker(&[
            "cfp",
            "worker",
            "--database",
            "db",
            "--container",
            "c",
            "--config",
            path,
            "--processor",
            "from-flag",
        ]);
        assert_eq!(w.processor.lease_expiration, std::time::Duration::from_secs(30));
        assert_eq!(w.processor.max_items, 7);
        assert_eq!(w.leases.processor, "from-flag");
        assert!(w.no_create_leases);
    }

    #[test]
    fn required_flags_can_come_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.yaml");
        std::fs::write(&path, "database: db\ncontainer: items\n").unwrap();
        let w = worker(&["cfp", "worker", "--config", path.to_str().unwrap()]);
        assert_eq!(
            (w.connection.database.as_str(), w.connection.container.as_str()),
            ("db", "items")
        );
        assert!(parse(["cfp", "worker"]).is_err(), "still required without a file");
    }

    #[test]
    fn unknown_settings_are_rejected_with_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, "lease-expiry: 30s\n").unwrap();
        let err = parse([
            "cfp",
            "worker",
            "--database",
            "d",
            "--container",
            "c",
            "--config",
            path.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("lease-expiry"), "{err}");
    }

    #[test]
    fn durations_and_start_positions_parse() {
        let w = worker(&[
            "cfp",
            "worker",
            "--database",
            "d",
            "--container",
            "c",
            "--poll-interval",
            "500ms",
            "--start-from",
            "2026-01-31T12:00:00Z",
        ]);
        assert_eq!(w.processor.poll_interval, std::time::Duration::from_millis(500));
        assert!(matches!(w.processor.start_from, crate::cosmos::StartFrom::Time(_)));
        assert!(
            parse([
                "cfp",
                "worker",
                "--database",
                "d",
                "--container",
                "c",
                "--start-from",
                "yesterday"
            ])
            .is_err()
        );
    }
}
