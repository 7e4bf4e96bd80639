//! Publishing a run's outputs as one set, and one writer per output directory.
//!
//! A run never writes an output file in place. Per output directory DIR:
//!
//! 1. **Lock** ([`OutputLock`]): `flock` on `DIR/.seistomo.lock` (holding the pid), taken before
//!    any work; the kernel drops it when the process dies, so `kill -9` never leaves it stale.
//!    A second run into DIR stops at once: "another seistomo run (pid N) is writing to DIR".
//!    With the lock held, [`recover`] settles what a killed run left (below).
//! 2. **Stage** ([`Publication::write`]): every file is written into `DIR/.seistomo-stage-RUN/`
//!    (same file system) through checked, buffered I/O, its writeback to the disk started every
//!    8 MiB as it is written (Linux `sync_file_range`, no waiting). At the commit every staged
//!    file is `fsync`ed, then the manifest `seistomo-outputs.json` (run id, command, every file
//!    with its size and CRC32C; sets of older versions carry an FNV-1a 64 hash) is written and
//!    synced with the directory. A failed write (a full disk) removes the staging directory: the
//!    previous outputs are untouched.
//! 3. **Prepare**: every name of the new set is made to resolve through one symbolic link,
//!    `DIR/.seistomo-current`, which first points at `DIR/.seistomo-old-RUN/` (hard links of the
//!    files those names held): each such file is replaced (one atomic rename) by the link
//!    `NAME -> .seistomo-current/NAME`, which reads the same bytes; a name that did not exist
//!    becomes a link that leads nowhere yet (a reader finds no file).
//! 4. **Switch**: `.seistomo-current` is renamed to point at the staging directory. This one
//!    atomic rename is the commit point: before it every name reads the previous set, after it
//!    the new one, whole.
//! 5. **Settle**: each name is replaced (atomic rename) by a hard link of its staged file, the
//!    manifest last, and `.seistomo-current` and the two directories are removed: regular files
//!    again, no dot files left.
//!
//! A `kill -9` at any step leaves either the whole previous set or the whole new one visible
//! under the files' names (in a directory some of them are links through
//! `.seistomo-current` until the next run); the next run into DIR (any command, `--resume`
//! included) settles it first ([`recover`]): the set `.seistomo-current` points at is kept,
//! the other thrown away, and a staging directory of a process that no longer exists removed.
//! Where the file system has no hard or symbolic links, the files are renamed into place one by
//! one (the version 1 protocol: a committed set `.seistomo-commit-RUN` rolled forward by the next
//! run). A set spread over several directories switches directory by directory.
//!
//! A reader ([`check_set`]) finds one complete set when the manifest is there, no legacy commit
//! directory is pending, and every file it names has the recorded size and hash. Files that the
//! manifest does not name are not part of the set.
//!
//! Fault injection for tests, in builds with the `fault-injection` feature only (environment
//! variables, read once per process; release builds have no hooks):
//! `SEISTOMO_FAULT_ENOSPC_AFTER=N`: staged writes fail with ENOSPC ("No space left on device")
//! once N bytes in all have been written; `SEISTOMO_FAULT_KILL_AT=K`: the process sends itself
//! SIGKILL at the K-th step of staging/committing (each write call, fsync and rename counts; the
//! number of steps is printed at the end of a run that got past them all; steps 3 to 5 count
//! each link, rename and sync);
//! `SEISTOMO_FAULT_HOLD_LOCK=FILE`: after taking the output lock, wait until FILE exists.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::Fnv;

/// The manifest of an output set, in each output directory.
pub const MANIFEST: &str = "seistomo-outputs.json";
/// The lock file of an output directory (removed when the run ends).
pub const LOCK_FILE: &str = ".seistomo.lock";
const STAGE: &str = ".seistomo-stage-";
const COMMIT: &str = ".seistomo-commit-";
/// Hard links of the previous set's files, while a set is switched.
const OLD: &str = ".seistomo-old-";
/// The one link every name of a set resolves through while it is switched.
const CURRENT: &str = ".seistomo-current";
/// Temporary names of links made to be renamed over a name.
const LINK: &str = ".seistomo-link-";
/// Manifest format name and version.
pub const MANIFEST_FORMAT: &str = "seistomo-outputs";
/// Version 2 records each file's CRC32C (hardware-accelerated: FNV-1a, one byte per multiply,
/// hashed at ~0.45 GB/s and took 0.24 s of writing a 110 MB model file); version 1 manifests
/// (FNV-1a) are still read and checked.
pub const MANIFEST_VERSION: u32 = 2;

/// Test hooks (see the module docs), compiled in only with the `fault-injection` feature.
#[cfg(feature = "fault-injection")]
mod fault {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    fn value(name: &str) -> Option<u64> {
        crate::settings::launch::fault(name).and_then(|v| v.trim().parse().ok())
    }
    fn enospc_after() -> Option<u64> {
        static V: OnceLock<Option<u64>> = OnceLock::new();
        *V.get_or_init(|| value("ENOSPC_AFTER"))
    }
    pub(super) fn kill_at() -> Option<u64> {
        static V: OnceLock<Option<u64>> = OnceLock::new();
        *V.get_or_init(|| value("KILL_AT"))
    }
    static WRITTEN: AtomicU64 = AtomicU64::new(0);
    static POINTS: AtomicU64 = AtomicU64::new(0);

    /// How many of `len` bytes may be written now (ENOSPC when none).
    pub(super) fn room(len: usize) -> std::io::Result<usize> {
        let Some(limit) = enospc_after() else {
            return Ok(len);
        };
        let done = WRITTEN.load(Ordering::Relaxed);
        let k = limit.saturating_sub(done).min(len as u64) as usize;
        if k == 0 && len > 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        WRITTEN.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }

    /// One step of staging or committing; SIGKILL at the chosen one.
    pub(super) fn point() {
        let k = POINTS.fetch_add(1, Ordering::Relaxed) + 1;
        if kill_at() == Some(k) {
            // SAFETY: kill(2) with this process's own pid and a valid signal number.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    pub(super) fn points() -> u64 {
        POINTS.load(Ordering::Relaxed)
    }

    /// After taking an output lock: wait until the file SEISTOMO_FAULT_HOLD_LOCK names exists.
    pub(super) fn hold_lock() {
        if let Some(hold) = crate::settings::launch::fault("HOLD_LOCK") {
            while !std::path::Path::new(&hold).exists() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// Release builds: no hooks (every write has room, no step kills, no lock is held).
#[cfg(not(feature = "fault-injection"))]
mod fault {
    pub(super) fn kill_at() -> Option<u64> {
        None
    }
    pub(super) fn room(len: usize) -> std::io::Result<usize> {
        Ok(len)
    }
    pub(super) fn point() {}
    pub(super) fn points() -> u64 {
        0
    }
    pub(super) fn hold_lock() {}
}

/// (year, month, day) of the day `days` after 1970-01-01 (H. Hinnant's civil-from-days).
pub fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A run id: UTC time, pid and a few random bits, e.g. `20261123T141502Z-4711-9f3a`.
pub fn new_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, sod) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_date(days as i64);
    let mut h = Fnv::default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z-{}-{:04x}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        std::process::id(),
        h.finish() & 0xffff
    )
}

/// One file of a set, as the manifest records it: its CRC32C (version 2) or its 64-bit FNV-1a
/// (version 1), as hex digits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub name: String,
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fnv1a64: Option<String>,
}

impl ManifestFile {
    /// The record of `bytes` bytes with CRC32C `crc` (what this version writes).
    fn new(name: String, bytes: u64, crc: u32) -> ManifestFile {
        ManifestFile {
            name,
            bytes,
            crc32c: Some(format!("{crc:08x}")),
            fnv1a64: None,
        }
    }
}

/// `seistomo-outputs.json`: which files form the set of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub program: String,
    pub version: String,
    pub run_id: String,
    pub command: String,
    /// In the order they were renamed into place.
    pub files: Vec<ManifestFile>,
}

/// Writes through to a staged file: counts the bytes and sums their CRC32C; fault hooks.
/// Bytes a staged file is written in before the kernel is asked to start writing them to the
/// disk: a large file (a model file of 100 MB) goes to the disk while its rest is written, and
/// the fsync before the commit waits only for its tail.
const WRITEBACK: usize = 8 << 20;

struct Staged {
    f: File,
    bytes: u64,
    crc: u32,
    /// Bytes whose writeback was started.
    started: u64,
}

impl Staged {
    fn new(f: File) -> Staged {
        Staged {
            f,
            bytes: 0,
            crc: 0,
            started: 0,
        }
    }

    /// Start writing the bytes written since the last start to the disk, without waiting
    /// (Linux: `sync_file_range` with `SYNC_FILE_RANGE_WRITE`; elsewhere nothing). Only a
    /// hint: the fsync before the commit is what makes the file durable, and reports errors.
    fn start_writeback(&mut self) {
        if self.bytes == self.started {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            let (off, len) = (self.started as i64, (self.bytes - self.started) as i64);
            // SAFETY: a plain system call on this open file's descriptor with integer
            // arguments; it reads or writes no memory of this process.
            unsafe {
                libc::sync_file_range(self.f.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
        self.started = self.bytes;
    }
}

impl Write for Staged {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = fault::room(buf.len().min(WRITEBACK))?;
        let k = self.f.write(&buf[..room])?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..k]);
        self.bytes += k as u64;
        if self.bytes - self.started >= WRITEBACK as u64 {
            self.start_writeback();
        }
        fault::point();
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.f.flush()
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fault::point();
    File::open(dir)?.sync_all()
}

fn dir_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Is `name` one of the names this module manages in an output directory?
pub fn is_reserved_name(name: &str) -> bool {
    name == MANIFEST || name.starts_with(".seistomo")
}

#[derive(PartialEq)]
enum State {
    Staging,
    Committed,
}

struct DirSet {
    dir: PathBuf,
    stage: PathBuf,
    files: Vec<ManifestFile>,
    /// The staged files (and their destinations) not yet synced: their writeback was started
    /// as they were written; [`Publication::commit`] syncs them all before the manifest.
    unsynced: Vec<(File, PathBuf)>,
    state: State,
}

/// The outputs of one run, staged and then published as one set (module docs).
pub struct Publication {
    run_id: String,
    command: String,
    dirs: Vec<DirSet>,
}

impl Publication {
    /// A new set for `command` (e.g. "invert"), with a fresh run id.
    pub fn new(command: &str) -> Publication {
        Publication {
            run_id: new_run_id(),
            command: command.to_string(),
            dirs: Vec::new(),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    fn slot(&mut self, dest: &Path) -> Result<(usize, String)> {
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                Error::Invalid(format!("output '{}' has no file name", dest.display()))
            })?;
        if is_reserved_name(&name) {
            return Err(Error::Invalid(format!(
                "output '{}': the name {name} is reserved for seistomo's own files",
                dest.display()
            )));
        }
        let dir = dir_of(dest);
        let i = match self.dirs.iter().position(|d| d.dir == dir) {
            Some(i) => i,
            None => {
                fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
                let stage = dir.join(format!("{STAGE}{}", self.run_id));
                fault::point();
                fs::create_dir(&stage).map_err(|e| Error::io(&stage, e))?;
                self.dirs.push(DirSet {
                    dir,
                    stage,
                    files: Vec::new(),
                    unsynced: Vec::new(),
                    state: State::Staging,
                });
                self.dirs.len() - 1
            }
        };
        if self.dirs[i].files.iter().any(|f| f.name == name) {
            return Err(Error::Invalid(format!(
                "two outputs of this run are the same file '{}'",
                dest.display()
            )));
        }
        Ok((i, name))
    }

    /// Stage `dest`: `body` writes its content (`.gz` names are gzip-compressed). Every write,
    /// the flush and the fsync are checked; on error the staged file is removed and `dest`'s
    /// name is in the error.
    pub fn write<F>(&mut self, dest: &Path, body: F) -> Result<()>
    where
        F: FnOnce(&mut dyn Write) -> io::Result<()>,
    {
        let (i, name) = self.slot(dest)?;
        let tmp = self.dirs[i].stage.join(&name);
        let gz = name.ends_with(".gz");
        let r = (|| -> io::Result<(ManifestFile, File)> {
            fault::point();
            let f = File::create(&tmp)?;
            let mut w = BufWriter::with_capacity(1 << 20, Staged::new(f));
            super::write_maybe_gz(&mut w, gz, body)?;
            let mut s = w.into_inner().map_err(|e| e.into_error())?;
            s.start_writeback();
            Ok((ManifestFile::new(name.clone(), s.bytes, s.crc), s.f))
        })();
        match r {
            Ok((m, f)) => {
                self.dirs[i].files.push(m);
                self.dirs[i].unsynced.push((f, dest.to_path_buf()));
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(Error::io(dest, e))
            }
        }
    }

    /// Stage `dest` with these bytes.
    pub fn write_bytes(&mut self, dest: &Path, bytes: &[u8]) -> Result<()> {
        self.write(dest, |w| w.write_all(bytes))
    }

    /// Publish every staged file (module docs, steps 3 and 4).
    pub fn commit(mut self) -> Result<()> {
        // All I/O that can run out of space first: the staged files synced (their writeback
        // is under way), then the manifests, synced with their directory.
        for d in &mut self.dirs {
            for (f, dest) in d.unsynced.drain(..) {
                fault::point();
                f.sync_all().map_err(|e| Error::io(&dest, e))?;
            }
        }
        for d in &mut self.dirs {
            let m = Manifest {
                format: MANIFEST_FORMAT.into(),
                format_version: MANIFEST_VERSION,
                program: "seistomo".into(),
                version: crate::VERSION.into(),
                run_id: self.run_id.clone(),
                command: self.command.clone(),
                files: d.files.clone(),
            };
            let text = serde_json::to_vec_pretty(&m).map_err(|e| Error::Invalid(e.to_string()))?;
            let p = d.stage.join(MANIFEST);
            let r = (|| -> io::Result<()> {
                fault::point();
                let mut s = Staged::new(File::create(&p)?);
                s.write_all(&text)?;
                s.write_all(b"\n")?;
                fault::point();
                s.f.sync_all()?;
                sync_dir(&d.stage)
            })();
            r.map_err(|e| Error::io(d.dir.join(MANIFEST), e))?;
        }
        // Every name of the new set through `.seistomo-current` (step 3), in every directory
        // before any switches; a directory without links takes the version 1 protocol.
        let mut linked = Vec::with_capacity(self.dirs.len());
        for d in &self.dirs {
            let names = set_names(&d.files);
            match prepare(&d.dir, &d.stage, &self.run_id, &names) {
                Ok(l) => linked.push(l),
                Err(e) => {
                    // Back to the previous set everywhere (what the next run would do).
                    for d in &self.dirs[..=linked.len()] {
                        let _ = settle(&d.dir);
                        remove_leftovers(&d.dir, false);
                    }
                    return Err(e);
                }
            }
        }
        // The commit points (step 4), then regular files again (step 5).
        for (k, &l) in linked.iter().enumerate() {
            let d = &mut self.dirs[k];
            if l {
                let switched = switch(&d.dir, &d.stage, &self.run_id);
                // Whatever failed, the staging directory is the set once the link names it.
                let stage_name = d.stage.file_name().map(Path::new);
                if fs::read_link(d.dir.join(CURRENT)).ok().as_deref() == stage_name {
                    d.state = State::Committed;
                }
                if let Err(e) = switched {
                    for d in &self.dirs[k..] {
                        let _ = settle(&d.dir);
                        remove_leftovers(&d.dir, false);
                    }
                    return Err(e);
                }
            } else {
                let c = d.dir.join(format!("{COMMIT}{}", self.run_id));
                fault::point();
                fs::rename(&d.stage, &c).map_err(|e| Error::io(&c, e))?;
                d.stage = c;
                d.state = State::Committed;
                sync_dir(&d.dir).map_err(|e| Error::io(&d.dir, e))?;
            }
        }
        for (d, &l) in self.dirs.iter().zip(&linked) {
            if l {
                settle(&d.dir)?;
            } else {
                roll_forward(&d.stage, &d.dir)?;
            }
        }
        if fault::kill_at().is_some() {
            eprintln!("publish: {} fault points", fault::points());
        }
        Ok(())
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        // A set that was not committed is thrown away; a committed one is left for the next
        // run's [`recover`] (its roll-forward failed half-way).
        for d in &self.dirs {
            if d.state == State::Staging {
                let _ = fs::remove_dir_all(&d.stage);
            }
        }
    }
}

/// The names of a set in the order they are settled: its files, the manifest last.
fn set_names(files: &[ManifestFile]) -> Vec<String> {
    files
        .iter()
        .map(|f| f.name.clone())
        .chain([MANIFEST.to_string()])
        .collect()
}

/// Is the error one of a file system that has no hard or symbolic links?
fn no_links(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS | libc::EMLINK)
    )
}

/// Replace `dst` by a new link (a hard link of `src`, or a symbolic link to `src` when
/// `symbolic`) in one atomic rename through a temporary name `tmp`.
fn link_over(src: &Path, dst: &Path, tmp: &Path, symbolic: bool) -> io::Result<()> {
    let _ = fs::remove_file(tmp);
    fault::point();
    if symbolic {
        std::os::unix::fs::symlink(src, tmp)?;
    } else {
        fs::hard_link(src, tmp)?;
    }
    fault::point();
    fs::rename(tmp, dst)
}

/// Step 3 in `dir` for the staged set in `stage` of run `run`: the previous files of `names`
/// hard-linked into `.seistomo-old-RUN`, `.seistomo-current` pointing there, and each name
/// replaced by a link through it. Ok(false), with nothing changed, where the file system has
/// no links (the caller renames files into place instead).
fn prepare(dir: &Path, stage: &Path, run: &str, names: &[String]) -> Result<bool> {
    let old = dir.join(format!("{OLD}{run}"));
    let tmp = dir.join(format!("{LINK}{run}"));
    let current = dir.join(CURRENT);
    let err = |p: &Path, e: io::Error| Error::io(p, e);
    // Can this file system link? (A probe in the staging directory, which is thrown away
    // anyway.)
    let probe = stage.join(format!("{LINK}probe"));
    let linkable = fs::hard_link(stage.join(MANIFEST), &probe)
        .and_then(|()| fs::remove_file(&probe))
        .and_then(|()| std::os::unix::fs::symlink(MANIFEST, &probe))
        .and_then(|()| fs::remove_file(&probe));
    match linkable {
        Ok(()) => {}
        Err(e) if no_links(&e) => return Ok(false),
        Err(e) => return Err(err(stage, e)),
    }
    fault::point();
    fs::create_dir(&old).map_err(|e| err(&old, e))?;
    let mut regular = Vec::with_capacity(names.len());
    for n in names {
        let p = dir.join(n);
        let is_file = fs::symlink_metadata(&p).is_ok_and(|m| m.is_file());
        if is_file {
            fault::point();
            fs::hard_link(&p, old.join(n)).map_err(|e| err(&p, e))?;
        }
        regular.push(is_file || fs::symlink_metadata(&p).is_err());
    }
    sync_dir(&old).map_err(|e| err(&old, e))?;
    let target = old.file_name().expect("a directory name");
    fault::point();
    std::os::unix::fs::symlink(target, &current).map_err(|e| err(&current, e))?;
    sync_dir(dir).map_err(|e| err(dir, e))?;
    // A name that is neither a regular file nor absent (a link of the user's) is replaced
    // when the set settles.
    for (n, _) in names.iter().zip(regular).filter(|(_, r)| *r) {
        let through = Path::new(CURRENT).join(n);
        link_over(&through, &dir.join(n), &tmp, true).map_err(|e| err(&dir.join(n), e))?;
    }
    sync_dir(dir).map_err(|e| err(dir, e))?;
    Ok(true)
}

/// Step 4 in `dir`: `.seistomo-current` pointed at the staging directory `stage` (a new link
/// renamed over it), and `dir` synced.
fn switch(dir: &Path, stage: &Path, run: &str) -> Result<()> {
    let next = dir.join(format!("{LINK}{run}-next"));
    let target = stage.file_name().expect("a staging directory name");
    let _ = fs::remove_file(&next);
    fault::point();
    std::os::unix::fs::symlink(target, &next).map_err(|e| Error::io(&next, e))?;
    fault::point();
    fs::rename(&next, dir.join(CURRENT)).map_err(|e| Error::io(dir, e))?;
    sync_dir(dir).map_err(|e| Error::io(dir, e))
}

/// Step 5, and what [`recover`] does with a set a killed run left being switched: every name
/// that is a link through `.seistomo-current` becomes a hard link of the file it reads (of the
/// set the link points at); a link to a file that set lacks is removed; then the link and the
/// old and staging directories go. Idempotent.
fn settle(dir: &Path) -> Result<()> {
    let current = dir.join(CURRENT);
    let err = |p: &Path, e: io::Error| Error::io(p, e);
    let Ok(target) = fs::read_link(&current) else {
        return Ok(());
    };
    let set = dir.join(&target);
    let tmp = dir.join(format!("{LINK}settle"));
    // The set's files (the staged set, or the previous files of the names being replaced),
    // the manifest last.
    let mut names: Vec<String> = fs::read_dir(&set)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with(LINK))
                .collect()
        })
        .unwrap_or_default();
    names.sort_by_key(|n| n == MANIFEST);
    let through =
        |n: &str| fs::read_link(dir.join(n)).is_ok_and(|t| t == Path::new(CURRENT).join(n));
    for n in &names {
        let (src, dst) = (set.join(n), dir.join(n));
        let staged = fs::symlink_metadata(&src).is_ok_and(|m| m.is_file());
        // Names that are regular files already are settled; a name of the user's (not a link
        // through the current set) is replaced only by the new set's file.
        if staged && (through(n) || !target.to_string_lossy().starts_with(OLD)) {
            if fs::symlink_metadata(&dst).is_ok_and(|m| m.is_file())
                && fs::symlink_metadata(&src)
                    .and_then(|a| fs::symlink_metadata(&dst).map(|b| (a, b)))
                    .is_ok_and(|(a, b)| a.ino() == b.ino() && a.dev() == b.dev())
            {
                continue;
            }
            link_over(&src, &dst, &tmp, false).map_err(|e| err(&dst, e))?;
        }
    }
    // Links through the current set to files it does not have (new names of a set that was
    // not switched).
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if through(&n) && fs::symlink_metadata(set.join(&n)).is_err() {
                fault::point();
                fs::remove_file(e.path()).map_err(|er| err(&e.path(), er))?;
            }
        }
    }
    sync_dir(dir).map_err(|e| err(dir, e))?;
    fault::point();
    fs::remove_file(&current).map_err(|e| err(&current, e))?;
    sync_dir(dir).map_err(|e| err(dir, e))?;
    remove_leftovers(dir, true);
    Ok(())
}

/// Remove what switching sets leaves in `dir` once no link points into it: old and
/// temporary-link names, and (with `stages`) staging directories of processes that no longer
/// exist. Best effort.
fn remove_leftovers(dir: &Path, stages: bool) {
    // Names may still resolve into these directories while the link exists.
    if fs::symlink_metadata(dir.join(CURRENT)).is_ok() {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let p = e.path();
        if n.starts_with(OLD) {
            let _ = fs::remove_dir_all(&p);
        } else if n.starts_with(LINK) {
            let _ = fs::remove_file(&p);
        } else if let Some(run) = n.strip_prefix(STAGE).filter(|_| stages) {
            let gone =
                Path::new("/proc/self").exists() && pid_of_run(run).is_some_and(|p| !alive(p));
            if gone || pid_of_run(run) == Some(std::process::id()) {
                let _ = fs::remove_dir_all(&p);
            }
        }
    }
}

fn read_manifest(p: &Path) -> Result<Manifest> {
    let text = super::read_input_text(p, "output manifest", super::MAX_TEXT)?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| Error::format(p, format!("output manifest: {e}")))?;
    if m.format != MANIFEST_FORMAT {
        return Err(Error::format(p, "not a seistomo output manifest"));
    }
    Ok(m)
}

/// The version 1 protocol (file systems without links, and sets an older seistomo left): move
/// a committed set into `dir` (idempotent: files already moved are skipped).
fn roll_forward(commit: &Path, dir: &Path) -> Result<()> {
    let mp = commit.join(MANIFEST);
    if mp.exists() {
        let m = read_manifest(&mp)?;
        for f in &m.files {
            let src = commit.join(&f.name);
            if fs::symlink_metadata(&src).is_ok() {
                fault::point();
                let dst = dir.join(&f.name);
                fs::rename(&src, &dst).map_err(|e| Error::io(&dst, e))?;
            }
        }
        fault::point();
        let dst = dir.join(MANIFEST);
        fs::rename(&mp, &dst).map_err(|e| Error::io(&dst, e))?;
    }
    sync_dir(dir).map_err(|e| Error::io(dir, e))?;
    fault::point();
    fs::remove_dir_all(commit).map_err(|e| Error::io(commit, e))
}

fn pid_of_run(run: &str) -> Option<u32> {
    run.split('-').nth(1).and_then(|p| p.parse().ok())
}

fn alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists()
}

/// What a killed run left in `dir`: a committed set is rolled forward, a staging directory of
/// a process that no longer exists removed. Call with `dir`'s [`OutputLock`] held. Returns the
/// run ids that were completed.
pub fn recover(dir: &Path) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(done);
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // A set being switched: the one `.seistomo-current` points at is settled.
    if let Ok(target) = fs::read_link(dir.join(CURRENT)) {
        let t = target.to_string_lossy().into_owned();
        settle(dir)?;
        if let Some(run) = t.strip_prefix(STAGE) {
            done.push(run.to_string());
        } else if let Some(run) = t.strip_prefix(OLD) {
            eprintln!(
                "seistomo: note: run {run} was stopped before it published its outputs in {}: the previous set stays",
                dir.display()
            );
        }
    }
    for n in names {
        if let Some(run) = n.strip_prefix(COMMIT) {
            roll_forward(&dir.join(&n), dir)?;
            done.push(run.to_string());
        } else if let Some(run) = n.strip_prefix(STAGE) {
            let p = dir.join(&n);
            let proc = Path::new("/proc/self").exists();
            match pid_of_run(run) {
                // (Where liveness cannot be told, no /proc, it is left.)
                _ if !p.exists() || !proc => {}
                Some(pid) if alive(pid) => eprintln!(
                    "seistomo: note: {} is the staging directory of process {pid}, still running: left in place",
                    p.display()
                ),
                _ => {
                    let _ = fs::remove_dir_all(&p);
                }
            }
        }
    }
    remove_leftovers(dir, false);
    Ok(done)
}

/// A reader's check of the set in `dir`: the manifest, no publication pending, every file with
/// its recorded size and hash. Returns the manifest.
pub fn check_set(dir: &Path) -> Result<Manifest> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(COMMIT) {
                return Err(Error::format(
                    dir.join(&n),
                    "a committed output set is still being moved into place (the next seistomo run into this directory completes it)",
                ));
            }
        }
    }
    let m = read_manifest(&dir.join(MANIFEST))?;
    for f in &m.files {
        check_file(&dir.join(&f.name), f, &m.run_id)?;
    }
    Ok(m)
}

/// A committed set still being moved into `dir` (a run killed between its renames): complete
/// when every file it names is in the commit directory or already in `dir`, with the recorded
/// size and hash. `None` when nothing is pending. This is the set [`recover`] completes.
pub fn check_pending(dir: &Path) -> Result<Option<Manifest>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(None);
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if !n.starts_with(COMMIT) {
            continue;
        }
        let c = dir.join(&n);
        let mp = if c.join(MANIFEST).exists() {
            c.join(MANIFEST)
        } else {
            dir.join(MANIFEST)
        };
        let m = read_manifest(&mp)?;
        for f in &m.files {
            let staged = c.join(&f.name);
            let p = if fs::symlink_metadata(&staged).is_ok() {
                staged
            } else {
                dir.join(&f.name)
            };
            check_file(&p, f, &m.run_id)?;
        }
        return Ok(Some(m));
    }
    Ok(None)
}

fn check_file(p: &Path, f: &ManifestFile, run: &str) -> Result<()> {
    let (mut h, mut crc) = (Fnv::default(), 0u32);
    let n = super::read_pieces(p, |piece| {
        if f.crc32c.is_some() {
            crc = crc32c::crc32c_append(crc, piece);
        } else {
            h.update(piece);
        }
    })?;
    let same = match (&f.crc32c, &f.fnv1a64) {
        (Some(c), _) => *c == format!("{crc:08x}"),
        (None, Some(v)) => *v == format!("{:016x}", h.finish()),
        (None, None) => false,
    };
    if n != f.bytes || !same {
        return Err(Error::format(
            p,
            format!(
                "not the file of run {run} named in {MANIFEST} ({n} bytes, expected {})",
                f.bytes
            ),
        ));
    }
    Ok(())
}

/// The output lock of one or more directories (module docs, step 1). Dropping it removes the
/// lock files and the output directories it created that stayed empty.
pub struct OutputLock {
    held: Vec<(PathBuf, File)>,
    created: Vec<PathBuf>,
}

fn read_pid(p: &Path) -> Option<u32> {
    // The holder writes its pid right after locking; give it a moment.
    for _ in 0..50 {
        if let Ok(s) = super::read_input_text(p, "lock file", 64) {
            if let Ok(pid) = s.trim().parse() {
                return Some(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    None
}

impl OutputLock {
    /// Lock every directory of `dirs` (created when missing), then [`recover`] each.
    pub fn acquire(dirs: &[PathBuf]) -> Result<OutputLock> {
        let mut lock = OutputLock {
            held: Vec::new(),
            created: Vec::new(),
        };
        let mut dirs: Vec<PathBuf> = dirs.to_vec();
        dirs.sort();
        dirs.dedup();
        for d in &dirs {
            // Create missing levels one by one, remembering them.
            let mut missing = Vec::new();
            let mut p = d.as_path();
            while !p.as_os_str().is_empty() && !p.exists() {
                missing.push(p.to_path_buf());
                match p.parent() {
                    Some(q) => p = q,
                    None => break,
                }
            }
            for m in missing.iter().rev() {
                match fs::create_dir(m) {
                    Ok(()) => lock.created.push(m.clone()),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::io(m, e)),
                }
            }
            if let Some(f) = lock_one(d)? {
                lock.held.push((d.join(LOCK_FILE), f));
            }
            fault::hold_lock();
            for run in recover(d)? {
                eprintln!(
                    "completed the outputs of run {run} in {} (that run was stopped while publishing them)",
                    d.display()
                );
            }
        }
        Ok(lock)
    }
}

fn lock_one(dir: &Path) -> Result<Option<File>> {
    let p = dir.join(LOCK_FILE);
    loop {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(|e| Error::io(&p, e))?;
        // SAFETY: flock(2) on a descriptor that `f` owns and keeps open during the call.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let who = read_pid(&p).map_or("pid unknown".to_string(), |n| format!("pid {n}"));
                return Err(Error::Invalid(format!(
                    "another seistomo run ({who}) is writing to {}",
                    dir.display()
                )));
            }
            // A file system without flock (some network mounts): run unprotected, and say so.
            eprintln!(
                "seistomo: warning: {}: cannot lock ({e}); a concurrent run into this directory would not be noticed",
                p.display()
            );
            return Ok(None);
        }
        // The previous holder may have removed the file between our open and our lock: the
        // lock only counts if the name still refers to the file we locked.
        let same = match (fs::metadata(&p), f.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if !same {
            continue;
        }
        // The pid is for the other run's message only: on a full disk it is left out (that run
        // then says "pid unknown"), the lock itself holds.
        let mut f = f;
        let _ = f
            .set_len(0)
            .and_then(|()| writeln!(f, "{}", std::process::id()));
        return Ok(Some(f));
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        for (p, f) in self.held.drain(..) {
            // Removed while still locked; closing `f` then releases the lock.
            let _ = fs::remove_file(&p);
            drop(f);
        }
        for d in self.created.iter().rev() {
            let _ = fs::remove_dir(d); // only when empty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("seistomo-pub-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Publish files (name, text) in `d` as one set.
    fn publish(d: &Path, files: &[(&str, &str)]) {
        let mut p = Publication::new("test");
        for (name, text) in files {
            p.write_bytes(&d.join(name), text.as_bytes()).unwrap();
        }
        p.commit().unwrap();
    }

    #[test]
    fn a_set_is_published_with_its_manifest_and_nothing_else() {
        let d = scratch("set");
        let mut p = Publication::new("test");
        p.write_bytes(&d.join("a.txt"), b"alpha").unwrap();
        p.write(&d.join("b.txt.gz"), |w| w.write_all(b"beta"))
            .unwrap();
        let run = p.run_id().to_string();
        p.commit().unwrap();
        assert_eq!(names(&d), ["a.txt", "b.txt.gz", MANIFEST]);
        let m = check_set(&d).unwrap();
        assert_eq!(m.run_id, run);
        assert_eq!(m.files.len(), 2);
        // A file changed after publication is caught.
        fs::write(d.join("a.txt"), b"alpha!").unwrap();
        let e = check_set(&d).unwrap_err().to_string();
        assert!(e.contains("a.txt") && e.contains(&run), "{e}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_failed_or_dropped_set_leaves_the_old_one() {
        let d = scratch("fail");
        publish(&d, &[("a.txt", "old")]);
        let mut p = Publication::new("test");
        p.write_bytes(&d.join("a.txt"), b"new").unwrap();
        let e = p.write(&d.join("b.txt"), |_| Err(io::Error::other("disk full")));
        assert!(e.unwrap_err().to_string().contains("b.txt"));
        drop(p);
        assert_eq!(names(&d), ["a.txt", MANIFEST]);
        assert_eq!(fs::read(d.join("a.txt")).unwrap(), b"old");
        check_set(&d).unwrap();
        // Same name twice and reserved names are refused.
        let mut p = Publication::new("test");
        p.write_bytes(&d.join("x"), b"1").unwrap();
        assert!(p.write_bytes(&d.join("x"), b"2").is_err());
        assert!(p.write_bytes(&d.join(MANIFEST), b"2").is_err());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_committed_set_is_rolled_forward_by_recover() {
        let d = scratch("roll");
        publish(&d, &[("a.txt", "old a"), ("b.txt", "old b")]);
        // A committed set whose first file was already moved (a kill between renames).
        let run = "20261123T000000Z-1-abcd";
        let c = d.join(format!("{COMMIT}{run}"));
        fs::create_dir(&c).unwrap();
        fs::write(d.join("a.txt"), b"new a").unwrap();
        fs::write(c.join("b.txt"), b"new b").unwrap();
        let file = |n: &str, t: &[u8]| {
            let mut h = Fnv::default();
            h.update(t);
            ManifestFile {
                name: n.into(),
                bytes: t.len() as u64,
                crc32c: None,
                fnv1a64: Some(format!("{:016x}", h.finish())),
            }
        };
        let m = Manifest {
            format: MANIFEST_FORMAT.into(),
            format_version: 1,
            program: "seistomo".into(),
            version: "x".into(),
            run_id: run.into(),
            command: "test".into(),
            files: vec![file("a.txt", b"new a"), file("b.txt", b"new b")],
        };
        fs::write(c.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        // A dead writer's staging directory.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        fs::create_dir(d.join(format!("{STAGE}20261123T000000Z-{dead}-0000"))).unwrap();
        assert!(check_set(&d).is_err());
        let lock = OutputLock::acquire(std::slice::from_ref(&d)).unwrap();
        assert!(d.join(LOCK_FILE).exists());
        drop(lock);
        assert_eq!(names(&d), ["a.txt", "b.txt", MANIFEST]);
        assert_eq!(check_set(&d).unwrap().run_id, run);
        let _ = fs::remove_dir_all(&d);
    }

    /// A run stopped between the steps of a switch (module docs): stopped after step 3 (the
    /// names lead through `.seistomo-current` to the previous files, a new name leads nowhere)
    /// or after step 4, the visible set is whole, and the next run settles it into regular
    /// files: the previous set, or the new one.
    #[test]
    fn a_set_stopped_while_switching_is_whole_and_settled_by_recover() {
        for switched in [false, true] {
            let d = scratch(&format!("switch-{switched}"));
            publish(&d, &[("a.txt", "old a"), ("b.txt", "old b")]);
            // A file of the user's that the new set names too.
            fs::write(d.join("c.txt"), b"stray c").unwrap();
            let old_set = check_set(&d).unwrap().run_id;
            let mut p = Publication::new("test");
            for (n, t) in [("a.txt", "new a"), ("c.txt", "new c"), ("e.txt", "new e")] {
                p.write_bytes(&d.join(n), t.as_bytes()).unwrap();
            }
            let run = p.run_id().to_string();
            // Stage the manifest as commit() does, then the steps one by one.
            let stage = d.join(format!("{STAGE}{run}"));
            let m = Manifest {
                format: MANIFEST_FORMAT.into(),
                format_version: MANIFEST_VERSION,
                program: "seistomo".into(),
                version: "x".into(),
                run_id: run.clone(),
                command: "test".into(),
                files: p.dirs[0].files.clone(),
            };
            fs::write(stage.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
            assert!(prepare(&d, &stage, &run, &set_names(&m.files)).unwrap());
            if switched {
                switch(&d, &stage, &run).unwrap();
                p.dirs[0].state = State::Committed;
            }
            std::mem::forget(p); // killed: no clean-up
            let read = |n: &str| fs::read_to_string(d.join(n)).ok();
            let (a, c, e) = (read("a.txt"), read("c.txt"), read("e.txt"));
            if switched {
                assert_eq!(check_set(&d).unwrap().run_id, run);
                assert_eq!((a.as_deref(), c.as_deref()), (Some("new a"), Some("new c")));
                assert_eq!(e.as_deref(), Some("new e"));
            } else {
                assert_eq!(check_set(&d).unwrap().run_id, old_set);
                assert_eq!(
                    (a.as_deref(), c.as_deref()),
                    (Some("old a"), Some("stray c"))
                );
                assert_eq!(e, None, "a new name read before the switch");
            }
            assert_eq!(read("b.txt").as_deref(), Some("old b"));
            let done = recover(&d).unwrap();
            assert_eq!(done.len(), usize::from(switched));
            let want: &[&str] = if switched {
                &["a.txt", "b.txt", "c.txt", "e.txt", MANIFEST]
            } else {
                &["a.txt", "b.txt", "c.txt", MANIFEST]
            };
            assert_eq!(names(&d), want);
            for n in want {
                assert!(fs::symlink_metadata(d.join(n)).unwrap().is_file(), "{n}");
            }
            assert_eq!(
                read("c.txt").as_deref(),
                Some(if switched { "new c" } else { "stray c" })
            );
            check_set(&d).unwrap();
            let _ = fs::remove_dir_all(&d);
        }
    }

    #[test]
    fn a_second_lock_on_a_directory_is_refused_naming_the_pid() {
        let d = scratch("lock");
        let sub = d.join("new/out");
        let a = OutputLock::acquire(std::slice::from_ref(&sub)).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        let e = match OutputLock::acquire(std::slice::from_ref(&sub)) {
            Ok(_) => panic!("locked twice"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&format!("pid {}", std::process::id())) && e.contains("new/out"),
            "{e}"
        );
        drop(a);
        // The directories it created were empty: removed.
        assert!(!d.join("new").exists());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn run_ids_name_the_time_and_pid() {
        let r = new_run_id();
        assert_eq!(pid_of_run(&r), Some(std::process::id()));
        assert_eq!(
            r.len(),
            "20261123T141502Z".len() + 1 + std::process::id().to_string().len() + 5
        );
    }
}
