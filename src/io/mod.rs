//! Files, in four parts:
//!
//! - [`dataset`] (the dataset format: manifest, kernel rows, damping, vectors; load, write,
//!   verify)
//! - transport ([`rowio`]: byte ranges, coalescing, trait `RangeSource`; [`mpiio`]: MPI-IO
//!   calls; [`mmap`])
//! - foreign formats ([`mtx`]: Matrix Market; [`petsc`]; [`npy`]); [`prepared`] (a rank's
//!   prepared storage, checksummed arrays)
//! - publishing outputs ([`publish`]: outputs as one set, locks; [`outpaths`]; `tidy`;
//!   [`limits`]: memory plan)
//!
//! and the helpers every reader and writer shares (here): the one reader policy (`input`:
//! [`open_input`], [`check_regular`], [`read_input`]: regular files only), transparent gzip on
//! read, and atomic
//! writes (a temporary file renamed into place) so that an interrupted run never leaves a
//! truncated output that looks complete.

pub mod dataset;
pub mod finite;
mod gz;
mod input;
pub mod limits;
pub mod mmap;
#[cfg(feature = "mpi")]
pub mod mpiio;
pub mod mtx;
pub mod npy;
pub mod outpaths;
pub mod petsc;
pub mod prepared;
pub mod publish;
pub mod rowio;
mod tidy;

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub use dataset::{global_row_order, load_dataset, load_dataset_with, LoadOptions};
pub use input::{check_regular, open_input, read_input, read_input_text, MAX_TEXT};
pub use tidy::tidy;

/// 64-bit FNV-1a (the checkpoint's checksum and fingerprint, version 1 output manifests, run
/// ids).
#[derive(Clone, Copy)]
pub struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// Open a text file for buffered reading (a regular file: [`open_input`]); `.gz` files are
/// decompressed on the fly (on every thread where the file allows: `io::gz`).
pub fn open_text(path: &Path) -> Result<Box<dyn BufRead>> {
    if path.extension().is_some_and(|e| e == "gz") {
        Ok(gz::open(path)?)
    } else {
        let f = open_input(path)?;
        Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
    }
}

/// The temporary name an atomic write uses beside `path`.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// Remove the temporary files that writers of `path` killed mid-write (`kill -9`, a node lost)
/// left beside it: `.{name}.tmp{pid}` where process `pid` no longer exists. Where liveness cannot
/// be told (no `/proc`), nothing is removed. Best effort: failures are ignored.
pub(crate) fn remove_stale_temps(path: &Path) {
    let proc_fs = Path::new("/proc/self");
    if !proc_fs.exists() {
        return;
    }
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!(".{name}.tmp");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for e in entries.flatten() {
        let fname = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = fname
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != me && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Write `path` atomically: `body` writes into a temporary file in the same directory, which is
/// flushed, synced and renamed over `path` only when `body` succeeded. `.gz` paths are
/// gzip-compressed.
pub fn write_atomic<F>(path: &Path, body: F) -> Result<()>
where
    F: FnOnce(&mut dyn Write) -> std::io::Result<()>,
{
    write_atomic_as(path, path.extension().is_some_and(|e| e == "gz"), body)
}

/// [`write_atomic`], gzip-compressing what `body` writes only where `gz` says (a writer that
/// compresses its own members passes false).
pub(crate) fn write_atomic_as<F>(path: &Path, gz: bool, body: F) -> Result<()>
where
    F: FnOnce(&mut dyn Write) -> std::io::Result<()>,
{
    remove_stale_temps(path);
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let f = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        write_maybe_gz(&mut w, gz, body)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(())
    })();
    replace_with_temp(&tmp, path, result.map_err(|e| Error::io(path, e)))
}

/// `body` writing into `w`: through a (fast) gzip stream, finished after it, when `gz` (members
/// compressed in parallel that readers decode in parallel: `io::gz::Members`).
pub(crate) fn write_maybe_gz<W, F>(w: &mut W, gz: bool, body: F) -> std::io::Result<()>
where
    W: Write,
    F: FnOnce(&mut dyn Write) -> std::io::Result<()>,
{
    if gz {
        let mut z = gz::Members::new(w);
        body(&mut z)?;
        z.finish()?;
    } else {
        body(w)?;
    }
    Ok(())
}

/// The temporary file `tmp`, once `written`, renamed over `path`; removed instead where writing
/// it failed (that error is returned) or the rename fails (an error naming `path`).
pub(crate) fn replace_with_temp(tmp: &Path, path: &Path, written: Result<()>) -> Result<()> {
    match written {
        Ok(()) => std::fs::rename(tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(tmp);
            Error::io(path, e)
        }),
        Err(e) => {
            let _ = std::fs::remove_file(tmp);
            Err(e)
        }
    }
}

/// Read the file at `path` to its end, handing each piece read to `each`; returns the number
/// of bytes read. Errors name `path`.
pub(crate) fn read_pieces(path: &Path, mut each: impl FnMut(&[u8])) -> Result<u64> {
    let mut file = open_input(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if k == 0 {
            break;
        }
        each(&buf[..k]);
        n += k as u64;
    }
    Ok(n)
}

/// Write a vector as text, one value per line in shortest round-trip form (`{:e}`).
pub fn write_vector_text(path: &Path, x: &[f64]) -> Result<()> {
    write_atomic(path, |w| vector_text(w, x))
}

/// A vector as text, one value per line in shortest round-trip form (`{:e}`). The values are
/// formatted on the thread pool, 2^20 at a time, and written in order (the formatting, ~160 ns
/// a value, took 0.21 s of a 1.31M-cell run's outputs on one thread).
pub fn vector_text(w: &mut dyn Write, x: &[f64]) -> std::io::Result<()> {
    use rayon::prelude::*;
    use std::fmt::Write as _;
    const PIECE: usize = 1 << 14;
    const BATCH: usize = PIECE << 4;
    let text = |batch: &[f64]| -> Vec<String> {
        batch
            .par_chunks(PIECE)
            .map(|piece| {
                let mut t = String::with_capacity(piece.len() * 24);
                for v in piece {
                    // writing into a String cannot fail
                    let _ = writeln!(t, "{v:e}");
                }
                t
            })
            .collect()
    };
    // Each batch formatted (on the thread pool) while the one before is written.
    let mut batches = x.chunks(BATCH);
    let mut ready = batches.next().map(text);
    while let Some(texts) = ready.take() {
        let next = batches.next();
        std::thread::scope(|s| -> std::io::Result<()> {
            let made = next.map(|b| s.spawn(move || text(b)));
            for t in &texts {
                w.write_all(t.as_bytes())?;
            }
            ready = made.map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            Ok(())
        })?;
    }
    Ok(())
}

/// `path` when it is a regular file (following links), else "file '...' not found" or the
/// reader policy's refusal ([`check_regular`]).
pub fn existing_file(path: PathBuf) -> std::result::Result<PathBuf, String> {
    if path.is_file() {
        Ok(path)
    } else if path.exists() {
        Err(check_regular(&path).err().map_or_else(
            || format!("'{}' is not a regular file", path.display()),
            |e| e.to_string(),
        ))
    } else {
        Err(format!("file '{}' not found", path.display()))
    }
}

/// A scratch directory for unit tests, `seistomo-{tag}-{pid}` in the system's temporary
/// directory, created if missing (not emptied: tests of one tag may share it). The directories
/// of the same tag left by test processes that have ended (no /proc entry for their pid) are
/// removed first, so runs (one process a test under nextest) do not pile them up.
#[cfg(test)]
pub(crate) fn test_dir(tag: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    let me = std::process::id();
    let prefix = format!("seistomo-{tag}-");
    let proc_fs = Path::new("/proc/self").exists();
    for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if proc_fs && pid != me && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = tmp.join(format!("{prefix}{me}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temps_of_dead_writers_are_removed() {
        let dir = test_dir("stale");
        let p = dir.join("checkpoint.bin");
        // A dead writer: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = dir.join(format!(".checkpoint.bin.tmp{dead}"));
        // A live writer (this process's parent stands in) and an unrelated hidden file.
        let live = dir.join(format!(
            ".checkpoint.bin.tmp{}",
            std::os::unix::process::parent_id()
        ));
        let other = dir.join(".other.tmp1");
        for f in [&stale, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        write_atomic(&p, |w| w.write_all(b"new")).unwrap();
        if Path::new("/proc/self").exists() {
            assert!(!stale.exists(), "the dead writer's temporary file stayed");
        }
        assert!(live.exists() && other.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn atomic_write_leaves_nothing_on_error() {
        let dir = test_dir("io");
        let p = dir.join("out.txt");
        let r = write_atomic(&p, |w| {
            writeln!(w, "partial")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        write_vector_text(&p, &[0.1, 1e-300]).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "1e-1\n1e-300\n");
    }

    #[test]
    fn a_long_vector_is_written_in_order_across_its_batches() {
        // several batches of 256k values and a short last one, formatted while the one
        // before is written: the lines of a plain loop, in order
        let x: Vec<f64> = (0..700_001)
            .map(|i| (i as f64 * 0.37).sin() * 1e3)
            .collect();
        let mut got = Vec::new();
        vector_text(&mut got, &x).unwrap();
        let want: String = x.iter().map(|v| format!("{v:e}\n")).collect();
        assert!(got == want.as_bytes());
        // a failing writer stops the write with its error
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("full"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        assert!(vector_text(&mut Full, &x).is_err());
        vector_text(&mut got, &[]).unwrap();
    }
}
