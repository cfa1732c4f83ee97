//! The one error of configuration, every section's checks return it.

use std::path::PathBuf;

/// Exit status of a configuration error (`EX_USAGE` of sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration problem, one line, naming the offending setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema (unknown key,
    /// wrong type, bad duration).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The path given.
        path: PathBuf,
        /// The parser's message, folded to one line.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid setting `{field}`: {reason}")]
    Invalid {
        /// Dotted path of the setting.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
