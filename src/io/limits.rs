//! The memory plan of a reader: a size declared in a file's header is compared with the memory
//! of the machine before anything is allocated for it, so that a lying or absurd header ends in
//! a one-line error naming the file and the numbers instead of an aborted allocation.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Bytes of memory one allocation plan may use: SEISTOMO_MEMORY_LIMIT (bytes) when set, else
/// the machine's physical memory (`MemTotal` of /proc/meminfo); `None` where neither is known
/// (no check).
pub fn memory_limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        if let Some(v) = crate::settings::launch::memory_limit() {
            return Some(v);
        }
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    })
}

/// Error unless `bytes` (what `what` needs, read from `path`'s header) fits in the memory
/// limit.
pub fn check_alloc(path: &Path, what: &str, bytes: u128) -> Result<()> {
    match memory_limit() {
        Some(limit) if bytes > limit as u128 => Err(Error::format(
            path,
            format!(
                "{what} would take {bytes} bytes ({:.1} GiB) but this machine has {limit} bytes ({:.1} GiB) of memory",
                bytes as f64 / (1u64 << 30) as f64,
                limit as f64 / (1u64 << 30) as f64
            ),
        )),
        _ => Ok(()),
    }
}
