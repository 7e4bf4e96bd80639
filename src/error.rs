//! Library errors. Every error that comes from a file names the file (and the line or row where
//! one is known), so that the CLI can print it on one line.

use std::path::{Path, PathBuf};

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Structural problems of a sparse matrix found by a validating constructor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StructureError {
    #[error("row offsets have length {got}, expected nrows + 1 = {expected}")]
    OffsetsLength { got: usize, expected: usize },
    #[error("row offsets must start at 0 (found {0})")]
    OffsetsStart(u64),
    #[error("row offsets decrease at row {row}")]
    OffsetsDecrease { row: usize },
    #[error("last row offset is {last} but there are {nnz} stored entries")]
    OffsetsEnd { last: u64, nnz: usize },
    #[error("{indices} column indices but {values} values")]
    LengthMismatch { indices: usize, values: usize },
    #[error("row {row}: column {col} out of range (ncols = {ncols})")]
    ColumnOutOfRange { row: usize, col: u64, ncols: usize },
    #[error("row {row}: columns not strictly increasing at column {col} (unsorted or duplicate)")]
    Unsorted { row: usize, col: u32 },
    #[error("row {row}, column {col}: value is not finite ({value})")]
    NonFinite { row: usize, col: u32, value: f64 },
    #[error("{ncols} columns do not fit 32-bit column indices")]
    TooManyColumns { ncols: usize },
    #[error("shape mismatch: {0}")]
    Shape(String),
}

/// Every error the library reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused a read or write. (The OS error is part of the message and deliberately
    /// not an error `source`, so that the one-line CLI message does not repeat it.)
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    /// A text file has a bad line.
    #[error("{}:{line}: {msg}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    /// A file's content is inconsistent (wrong counts, bad header, corrupted binary).
    #[error("{}: {msg}", path.display())]
    Format { path: PathBuf, msg: String },
    /// A matrix built in memory (not from a file) is malformed.
    #[error("invalid matrix: {0}")]
    Structure(#[from] StructureError),
    /// A configuration file or command-line option is invalid.
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    /// An argument is invalid (sizes that do not agree, bad options).
    #[error("{0}")]
    Invalid(String),
    /// A compute backend failed or is unavailable.
    #[error("backend {backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
    /// A compute backend's own typed error (e.g. the CUDA backend's `CudaError`: what a device
    /// library reported and what was being done), held without this module knowing its type.
    /// Its message is part of this one, so it is deliberately not an error `source` (the
    /// one-line CLI message would repeat it); reach it with `err.downcast_ref`.
    #[error("backend {backend}: {err}")]
    Device {
        backend: &'static str,
        err: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Communication between ranks failed.
    #[error("communication: {0}")]
    Comm(String),
    /// An error one rank hit, made known to every rank of the job (see `comm::agree`).
    #[error("rank {rank}: {msg}")]
    Rank { rank: usize, msg: String },
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            err: source,
        }
    }
    pub fn parse(path: impl AsRef<Path>, line: usize, msg: impl Into<String>) -> Self {
        Error::Parse {
            path: path.as_ref().to_path_buf(),
            line,
            msg: msg.into(),
        }
    }
    pub fn format(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }
    pub fn config(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Config {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }
    pub fn backend(backend: &'static str, msg: impl Into<String>) -> Self {
        Error::Backend {
            backend,
            msg: msg.into(),
        }
    }
    /// Attach a file name to a structure error found while loading that file.
    pub fn in_file(path: impl AsRef<Path>, e: StructureError) -> Self {
        Error::format(path, e.to_string())
    }
}

/// `FromStr` for a choice enum (config values, CLI options) from its names and aliases:
/// `choice_from_str!(Storage, "storage", "auto" => Self::Auto, "csr" | "plain" => Self::Csr)`.
/// An unknown name is the error "unknown storage 'x' (auto, csr)": the first name of each arm.
macro_rules! choice_from_str {
    ($t:ty, $what:literal, $($s:literal $(| $alias:literal)* => $v:expr),+ $(,)?) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($s $(| $alias)* => Ok($v),)+
                    _ => Err(format!(
                        concat!("unknown ", $what, " '{}' ({})"),
                        s,
                        [$($s),+].join(", ")
                    )),
                }
            }
        }
    };
}
