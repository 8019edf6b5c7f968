//! Reading the configuration: the file, layered files, `ONCEGATE_*` overrides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::*;

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause (in the message, not a `source()`: printed with its chain, it would be said twice).
        cause: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
    /// An environment override does not fit.
    #[error("environment variable {name}: {message}")]
    Env {
        /// The variable.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads `path` (or only defaults, if `None`) and applies `ONCEGATE_*` variables from `env`.
///
/// `ONCEGATE_STORE__PATH=/var/lib/oncegate.redb` sets `store.path`: sections and keys are
/// separated by a double underscore. Values are read as TOML where they parse (numbers, booleans)
/// and as strings otherwise.
pub fn load(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, LoadError> {
    let origin = path.map_or_else(|| PathBuf::from("<defaults>"), Path::to_path_buf);
    let text = match path {
        Some(path) => std::fs::read_to_string(path).map_err(|cause| LoadError::Read {
            path: path.to_path_buf(),
            cause,
        })?,
        None => String::new(),
    };
    load_str(&text, &origin, env)
}

/// The commented file of every default, which a configuration is laid over.
pub const DEFAULTS: &str = include_str!("../defaults.toml");

/// `over` laid onto `base`: tables merge key by key, anything else is replaced.
fn lay_over(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above))
                if !names_another_variant(below, &above) =>
            {
                lay_over(below, above);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// A section that names another `backend` than the one below replaces it whole: each backend
/// has only its own settings.
fn names_another_variant(below: &toml::Table, above: &toml::Table) -> bool {
    above
        .get("backend")
        .is_some_and(|backend| below.get("backend") != Some(backend))
}

/// Reads configuration text (`origin` names it in errors), applies `ONCEGATE_*` variables from
/// `env` to it, and lays the result over [`DEFAULTS`], as [`load`] does for a file.
pub fn load_str(
    text: &str,
    origin: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, LoadError> {
    let origin = origin.to_path_buf();
    let mut table: toml::Table = toml::from_str(text).map_err(|error| LoadError::Parse {
        path: origin.clone(),
        message: parse_error(text, &error),
    })?;
    let overrides: BTreeMap<String, String> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with("ONCEGATE_") && name.contains("__"))
        .collect();
    // The variables are one more layer, laid over the file as the file is over the defaults: a
    // variable naming another store backend replaces the file's store section. Each is also
    // tried on the file itself, which refuses one that reaches into a value.
    let mut from_env = toml::Table::new();
    let mut checked = table.clone();
    for (name, value) in &overrides {
        apply_override(&mut checked, name, value)?;
        apply_override(&mut from_env, name, value)?;
    }
    let file = table.clone();
    lay_over(&mut table, from_env);
    let error = match layered(table)? {
        Ok(config) => return Ok(config),
        Err(error) => error,
    };
    // Blamed on what brought it: the file alone, or else the variable that breaks it.
    if overrides.is_empty() || layered(file.clone())?.is_err() {
        return Err(LoadError::Parse {
            path: origin,
            message: error,
        });
    }
    for (name, value) in &overrides {
        let mut alone = toml::Table::new();
        apply_override(&mut alone, name, value)?;
        let mut table = file.clone();
        lay_over(&mut table, alone);
        if let Err(message) = layered(table)? {
            return Err(LoadError::Env {
                name: name.clone(),
                message: format!(
                    "{message} (set by the environment variable, not in {})",
                    origin.display()
                ),
            });
        }
    }
    // Only their combination fails.
    Err(LoadError::Env {
        name: overrides.keys().cloned().collect::<Vec<_>>().join(", "),
        message: format!("{error} (set by these environment variables together)"),
    })
}

/// A TOML syntax error as its place and what is wrong, without the quoted line that `toml` adds:
/// that line may hold an inline secret, and the error reaches logs and (on a reload) the admin
/// API's answer.
fn parse_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
            format!("TOML parse error at line {line}, column {column}: {message}")
        }
        None => format!("TOML parse error: {message}"),
    }
}

/// `table` laid over [`DEFAULTS`] and read as a configuration: the reading's error as text.
fn layered(table: toml::Table) -> Result<Result<Config, String>, LoadError> {
    let mut layered: toml::Table = toml::from_str(DEFAULTS).map_err(|error| LoadError::Parse {
        path: PathBuf::from("<built-in defaults>"),
        message: error.to_string(),
    })?;
    lay_over(&mut layered, table);
    Ok(Config::deserialize(toml::Value::Table(layered))
        .map_err(|error| plain_types(&error.to_string())))
}

/// Serde names a number setting by its Rust type ("expected u16"): said as the range it takes.
fn plain_types(message: &str) -> String {
    const TYPES: [(&str, &str); 6] = [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected f64", "expected a number"),
    ];
    TYPES
        .iter()
        .fold(message.to_owned(), |message, (rust, plain)| {
            message.replace(rust, plain)
        })
}

fn apply_override(table: &mut toml::Table, name: &str, value: &str) -> Result<(), LoadError> {
    let env_error = |message: String| LoadError::Env {
        name: name.to_owned(),
        message,
    };
    let path: Vec<String> = name["ONCEGATE_".len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(env_error(
            "expected ONCEGATE_<SECTION>__<KEY>, e.g. ONCEGATE_STORE__PATH".into(),
        ));
    }
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let (last, sections) = path
        .split_last()
        .ok_or_else(|| env_error("names no setting".into()))?;
    let mut current = table;
    for section in sections {
        let entry = current
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| env_error(format!("{section} is not a section")))?;
    }
    current.insert(last.clone(), parsed);
    Ok(())
}
