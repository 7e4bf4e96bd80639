//! Provenance of a model file: where, when, by what and from which inputs it was made.
//!
//! `write_model` calls [`annotate`] once, before closing the file. It adds the group
//! `/provenance`, whose attributes are
//!
//! ```text
//! created_utc        2026-11-23T13:45:07Z
//! command_line       seistomo invert datasets/demo/invert.toml (each argument quoted as needed)
//! working_directory  the directory the command ran in
//! seistomo_version   0.1.0
//! git_commit         the commit the binary was built from (build.rs; "-dirty" when the tree
//!                    had changes; "unknown" without git)
//! host               the host name
//! ranks, gpus, threads, backend   the job (gpus: ranks that used a GPU)
//! tuning             the run's tuning knobs as JSON (src/settings/tuning.rs; null: automatic)
//! input_files        every input file (config, matrices, every file of the dataset directory)
//! input_bytes        their sizes
//! input_crc32        their CRC-32 (zlib's polynomial, as `crc32` / Python's zlib.crc32), hex
//! dataset_manifest   the dataset's dataset.toml, verbatim (dataset runs)
//! ```
//!
//! and gives every `/history` dataset its units. The inputs are noted by the command
//! (`pipeline::config::note_config`, [`note_inputs`]) before the solve; a file written without notes (tests,
//! library use) has empty input lists.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ::hdf5::types::VarLenUnicode;
use ::hdf5::{H5Type, Location};

use crate::error::{Error, Result};
use crate::model::report::Report;

/// The commit this binary was built from (set by build.rs).
pub const GIT_COMMIT: &str = match option_env!("SEISTOMO_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

#[derive(Default)]
struct Notes {
    inputs: Vec<PathBuf>,
    manifest: Option<PathBuf>,
}

static NOTES: Mutex<Notes> = Mutex::new(Notes {
    inputs: Vec::new(),
    manifest: None,
});

fn notes() -> std::sync::MutexGuard<'static, Notes> {
    NOTES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forget the inputs and manifest noted so far: a process that runs several configs one after
/// another (the Python module's `invert`) records each run's own inputs, not every earlier
/// run's too (whose relative paths may no longer resolve).
pub fn forget_inputs() {
    let mut n = notes();
    n.inputs.clear();
    n.manifest = None;
}

/// Note input files for the provenance of the model files this process writes. A directory
/// stands for every file under it.
pub fn note_inputs<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) {
    let mut n = notes();
    for p in paths {
        let p = crate::io::tidy(p.as_ref());
        let files = if p.is_dir() { files_under(&p) } else { vec![p] };
        for f in files {
            if !n.inputs.contains(&f) {
                n.inputs.push(f);
            }
        }
    }
}

/// Note the manifest of the dataset a run reads (its dataset id goes into the provenance).
pub fn note_manifest(path: &Path) {
    notes().manifest = Some(crate::io::tidy(path));
}

/// Regular files under `dir`, sorted (symbolic links followed, hidden temp files skipped).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() && e.file_name() == crate::io::prepared::DIR {
                // a dataset's prepared storage: derived from its files (report.json's
                // `prepared` says when a run read it), not an input of its own
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// CRC-32 and length of a file: 16 MiB pieces read and summed on the thread pool, combined in
/// order (one thread took 0.2 s of a 1.2 GB dataset's outputs).
pub fn crc32_file(path: &Path) -> Result<(u32, u64)> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    const PIECE: u64 = 16 << 20;
    let f = crate::io::open_input(path)?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let pieces: Vec<flate2::Crc> = (0..len.div_ceil(PIECE))
        .into_par_iter()
        .map(|k| -> Result<flate2::Crc> {
            let at = k * PIECE;
            let mut buf = vec![0u8; PIECE.min(len - at) as usize];
            f.read_exact_at(&mut buf, at)
                .map_err(|e| Error::io(path, e))?;
            let mut c = flate2::Crc::new();
            c.update(&buf);
            Ok(c)
        })
        .collect::<Result<_>>()?;
    let mut crc = flate2::Crc::new();
    for p in &pieces {
        crc.combine(p);
    }
    Ok((crc.sum(), crc.amount() as u64))
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch.
pub fn utc_string(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = crate::io::publish::civil_date(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The command line as one string a shell would run again.
pub fn command_line() -> String {
    std::env::args_os()
        .map(|a| {
            let s = a.to_string_lossy().into_owned();
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                s
            } else {
                format!("'{}'", s.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host name (Linux: /proc; else $HOSTNAME).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(crate::settings::launch::hostname)
        .unwrap_or_else(|| "unknown".into())
}

/// Units of the `/history` datasets.
pub const HISTORY_UNITS: [(&str, &str); 8] = [
    ("itn", "1"),
    ("r1norm", "units of b (the data)"),
    ("r2norm", "units of b (the data)"),
    ("arnorm", "units of A^T b"),
    ("anorm", "units of A"),
    ("acond", "1"),
    ("xnorm", "units of x (the unknowns)"),
    ("seconds", "s"),
];

fn h5err(path: &Path, e: ::hdf5::Error) -> Error {
    Error::format(path, format!("HDF5: {e}"))
}

struct A<'p>(&'p Path);

impl A<'_> {
    fn s(&self, loc: &Location, name: &str, value: &str) -> Result<()> {
        let v: VarLenUnicode = value
            .replace('\0', " ")
            .parse()
            .map_err(|e| Error::format(self.0, format!("HDF5 string: {e}")))?;
        if loc.attr(name).is_ok() {
            loc.delete_attr(name).map_err(|e| h5err(self.0, e))?;
        }
        loc.new_attr::<VarLenUnicode>()
            .create(name)
            .and_then(|a| a.write_scalar(&v))
            .map_err(|e| h5err(self.0, e))
    }
    fn list(&self, loc: &Location, name: &str, values: &[String]) -> Result<()> {
        let v: Vec<VarLenUnicode> = values
            .iter()
            .map(|s| {
                s.replace('\0', " ")
                    .parse()
                    .map_err(|e| Error::format(self.0, format!("HDF5 string: {e}")))
            })
            .collect::<Result<_>>()?;
        loc.new_attr::<VarLenUnicode>()
            .shape([v.len()])
            .create(name)
            .and_then(|a| a.write_raw(&v))
            .map_err(|e| h5err(self.0, e))
    }
    fn num<T: H5Type>(&self, loc: &Location, name: &str, values: &[T]) -> Result<()> {
        let b = loc.new_attr::<T>();
        let r = if values.len() == 1 {
            b.create(name).and_then(|a| a.write_scalar(&values[0]))
        } else {
            b.shape([values.len()])
                .create(name)
                .and_then(|a| a.write_raw(values))
        };
        r.map_err(|e| h5err(self.0, e))
    }
}

/// Write `/provenance` and the `/history` units into an open model file (`path` names the
/// final file in errors).
/// A file's CRC-32 taken ahead, with the size and modification time it had then.
type Early = (
    PathBuf,
    Option<(u64, std::time::SystemTime)>,
    Result<(u32, u64)>,
);

static EARLY: Mutex<Option<std::thread::JoinHandle<Vec<Early>>>> = Mutex::new(None);

fn stamp(p: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// Start taking the CRC-32 of the inputs noted so far on a thread of its own (a 1.2 GB dataset
/// takes ~0.06 s on 16 cores): the pipeline calls it when the iterations start, so that the
/// checksums are ready when the model file is written. [`annotate`] uses a checksum taken
/// ahead only where the file's size and modification time are still what they were.
pub fn checksum_inputs_ahead() {
    let inputs = notes().inputs.clone();
    if inputs.is_empty() {
        return;
    }
    let job = std::thread::Builder::new()
        .name("seistomo-crc".into())
        .spawn(move || {
            inputs
                .into_iter()
                .map(|p| {
                    let before = stamp(&p);
                    let crc = crc32_file(&p);
                    let same = before.is_some() && stamp(&p) == before;
                    (p, before.filter(|_| same), crc)
                })
                .collect()
        });
    if let Ok(h) = job {
        *EARLY.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }
}

/// The checksums taken ahead (none if none were started or the thread failed).
fn taken_ahead() -> Vec<Early> {
    let h = EARLY.lock().unwrap_or_else(|p| p.into_inner()).take();
    h.and_then(|h| h.join().ok()).unwrap_or_default()
}

pub fn annotate(f: &::hdf5::File, path: &Path, report: &Report) -> Result<()> {
    let a = A(path);
    let g = f.create_group("provenance").map_err(|e| h5err(path, e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    a.s(&g, "created_utc", &utc_string(now))?;
    a.s(&g, "command_line", &command_line())?;
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    a.s(&g, "working_directory", &cwd)?;
    a.s(&g, "seistomo_version", crate::VERSION)?;
    a.s(&g, "git_commit", GIT_COMMIT)?;
    a.s(&g, "host", &host_name())?;
    a.num(&g, "ranks", &[report.ranks as u64])?;
    let gpus = if report.backend == "cuda" {
        report.ranks
    } else {
        0
    };
    a.num(&g, "gpus", &[gpus as u64])?;
    a.num(&g, "threads", &[report.threads as u64])?;
    a.s(&g, "backend", &report.backend)?;
    let tuning =
        serde_json::to_string(&report.tuning).map_err(|e| Error::Invalid(e.to_string()))?;
    a.s(&g, "tuning", &tuning)?;
    let (inputs, manifest) = {
        let n = notes();
        (n.inputs.clone(), n.manifest.clone())
    };
    let ahead = taken_ahead();
    let sums: Vec<(u32, u64)> = {
        use rayon::prelude::*;
        inputs
            .par_iter()
            .map(|p| {
                let early = ahead.iter().find(|(q, when, crc)| {
                    q == p && when.is_some() && *when == stamp(p) && crc.is_ok()
                });
                match early {
                    Some((_, _, Ok(sum))) => Ok(*sum),
                    _ => crc32_file(p),
                }
            })
            .collect::<Result<_>>()?
    };
    let names: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
    let sizes: Vec<u64> = sums.iter().map(|s| s.1).collect();
    let crcs: Vec<String> = sums.iter().map(|s| format!("{:08x}", s.0)).collect();
    if !inputs.is_empty() {
        a.list(&g, "input_files", &names)?;
        a.num(&g, "input_bytes", &sizes)?;
        a.list(&g, "input_crc32", &crcs)?;
    }
    if let Some(m) = manifest {
        let text = crate::io::read_input_text(&m, "dataset manifest", crate::io::MAX_TEXT)?;
        a.s(&g, "dataset_manifest", &text)?;
    }
    if let Ok(h) = f.group("history") {
        for (name, units) in HISTORY_UNITS {
            if let Ok(ds) = h.dataset(name) {
                a.s(&ds, "units", units)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_strings() {
        assert_eq!(utc_string(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_string(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_string(1_795_440_307), "2026-11-23T13:25:07Z");
    }

    #[test]
    fn crc32_matches_zlib() {
        let p = std::env::temp_dir().join(format!("seistomo-crc-{}", std::process::id()));
        std::fs::write(&p, b"123456789").unwrap();
        assert_eq!(crc32_file(&p).unwrap(), (0xcbf4_3926, 9));
        let _ = std::fs::remove_file(&p);
    }
}
