//! Inputs are never outputs: every command lists its inputs and outputs here before it does any
//! work, and [`PathCheck::check`] refuses an output that is an input (same canonical path after
//! following symlinks, or the same file through a hard link), lies inside an input dataset
//! directory, is named twice, is an existing directory or special file, or uses a name reserved
//! for the output manifest and lock. Paths that do not exist yet are resolved through their
//! nearest existing ancestor.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// `p` made absolute, symlinks resolved; for a path that does not exist (yet), its nearest
/// existing ancestor is resolved and the rest appended (`.` and `..` applied lexically).
pub fn canonical(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(p)
    };
    let mut base = abs.clone();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(c) = base.canonicalize() {
            let mut out = c;
            for part in rest.iter().rev() {
                match Path::new(part).components().next() {
                    Some(Component::ParentDir) => {
                        out.pop();
                    }
                    Some(Component::CurDir) | None => {}
                    _ => out.push(part),
                }
            }
            return out;
        }
        match (base.file_name(), base.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_os_string());
                base = parent.to_path_buf();
            }
            _ => {
                // `..` at the end or nothing resolvable: fall back to the lexical path.
                if let Some(parent) = base.parent() {
                    if base.ends_with("..") {
                        rest.push("..".into());
                        base = parent.to_path_buf();
                        continue;
                    }
                }
                return abs;
            }
        }
    }
}

struct Entry {
    what: String,
    shown: PathBuf,
    canon: PathBuf,
    /// (device, inode) of an existing file.
    id: Option<(u64, u64)>,
}

impl Entry {
    /// The same file: the same canonical path, or the same (device, inode).
    fn same_file(&self, o: &Entry) -> bool {
        self.canon == o.canon || (self.id.is_some() && self.id == o.id)
    }
}

/// The first entry of `list` for which `clash` holds, as `what 'path'` for a message.
fn first(list: &[Entry], clash: impl Fn(&Entry) -> bool) -> Option<String> {
    list.iter()
        .find(|e| clash(e))
        .map(|e| format!("{} '{}'", e.what, e.shown.display()))
}

fn entry(what: &str, p: &Path) -> Entry {
    Entry {
        what: what.to_string(),
        shown: p.to_path_buf(),
        canon: canonical(p),
        id: std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())),
    }
}

/// Check `c`, then lock the directories its output files go to (and recover what a killed run
/// left there): call before any work.
pub fn check_and_lock(c: &PathCheck) -> Result<crate::io::publish::OutputLock> {
    c.check()?;
    crate::io::publish::OutputLock::acquire(&c.output_parents())
}

/// What a path is to a command ([`PathCheck`]'s lists).
#[derive(Clone, Copy)]
enum Role {
    Input,
    InputDir,
    Output,
    OutputDir,
}

/// The inputs and outputs of one command (module docs).
#[derive(Default)]
pub struct PathCheck {
    inputs: Vec<Entry>,
    input_dirs: Vec<Entry>,
    outputs: Vec<Entry>,
    output_dirs: Vec<Entry>,
}

impl PathCheck {
    pub fn new() -> PathCheck {
        PathCheck::default()
    }

    /// An input file, e.g. `("--matrix", A.mtx)`.
    pub fn input(&mut self, what: &str, p: &Path) -> &mut Self {
        self.add(Role::Input, what, Some(p))
    }

    /// An output file.
    pub fn output(&mut self, what: &str, p: &Path) -> &mut Self {
        self.add(Role::Output, what, Some(p))
    }

    /// An input file that may be absent.
    pub fn input_opt(&mut self, what: &str, p: Option<&Path>) -> &mut Self {
        self.add(Role::Input, what, p)
    }

    /// An output file that may be absent.
    pub fn output_opt(&mut self, what: &str, p: Option<&Path>) -> &mut Self {
        self.add(Role::Output, what, p)
    }

    /// An input directory (a dataset): no output may lie inside it.
    pub fn input_dir(&mut self, what: &str, p: &Path) -> &mut Self {
        self.add(Role::InputDir, what, Some(p))
    }

    /// A directory that receives outputs (`export -o`, `synth --out`): it must not be an input,
    /// hold one, or lie inside an input dataset.
    pub fn output_dir(&mut self, what: &str, p: &Path) -> &mut Self {
        self.add(Role::OutputDir, what, Some(p))
    }

    /// Record `p` (when given) in the list of `role`.
    fn add(&mut self, role: Role, what: &str, p: Option<&Path>) -> &mut Self {
        if let Some(p) = p {
            let list = match role {
                Role::Input => &mut self.inputs,
                Role::InputDir => &mut self.input_dirs,
                Role::Output => &mut self.outputs,
                Role::OutputDir => &mut self.output_dirs,
            };
            list.push(entry(what, p));
        }
        self
    }

    /// The directories the output files go to (for [`crate::io::publish::OutputLock`]).
    pub fn output_parents(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .outputs
            .iter()
            .map(|o| match o.shown.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Every directory this command writes into: the directories of its output files and its
    /// output directories, with what names them.
    fn output_dir_list(&self) -> Vec<(String, PathBuf)> {
        let parents = self.outputs.iter().map(|o| {
            let d = match o.shown.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            (format!("the directory of {}", o.what), d.to_path_buf())
        });
        let dirs = self
            .output_dirs
            .iter()
            .map(|o| (o.what.clone(), o.shown.clone()));
        parents.chain(dirs).collect()
    }

    /// Refuse any clash (module docs); one line naming both paths.
    pub fn check(&self) -> Result<()> {
        let err = |msg: String| Err(Error::Invalid(msg));
        // The reader policy (crate::io::open_input), before any lock is taken: an input that
        // exists is a regular file.
        for i in &self.inputs {
            if std::fs::metadata(&i.shown).is_ok() {
                crate::io::check_regular(&i.shown)
                    .map_err(|e| Error::Invalid(format!("input {}: {e}", i.what)))?;
            }
        }
        for (k, o) in self.outputs.iter().enumerate() {
            let (what, od) = (&o.what, o.shown.display());
            if let Ok(m) = std::fs::metadata(&o.shown) {
                if m.is_dir() {
                    return err(format!("output {what} '{od}' is an existing directory"));
                }
                if !m.is_file() {
                    return err(format!(
                        "output {what} '{od}' exists and is not a regular file"
                    ));
                }
            }
            let name = o
                .canon
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if crate::io::publish::is_reserved_name(&name) {
                return err(format!(
                    "output {what} '{od}': the name {name} is reserved for seistomo's own files"
                ));
            }
            if let Some(i) = first(&self.inputs, |i| i.same_file(o)) {
                let why = "refusing to overwrite an input";
                return err(format!("output {what} '{od}' is the input {i}: {why}"));
            }
            if let Some(i) = first(&self.input_dirs, |i| o.canon.starts_with(&i.canon)) {
                return err(format!(
                    "output {what} '{od}' lies inside the input dataset {i}"
                ));
            }
            if let Some(p) = self.outputs[..k].iter().find(|p| p.same_file(o)) {
                let earlier = &p.what;
                return err(format!(
                    "outputs {earlier} and {what} are the same file '{od}'"
                ));
            }
        }
        for (what, d) in self.output_dir_list() {
            refuse_system_dir(&what, &d)?;
        }
        for o in &self.output_dirs {
            let (what, od) = (&o.what, o.shown.display());
            if o.shown.exists() && !o.shown.is_dir() {
                return err(format!("output {what} '{od}' is not a directory"));
            }
            if let Some(i) = first(&self.input_dirs, |i| o.canon.starts_with(&i.canon)) {
                return err(format!(
                    "output {what} '{od}' is or lies inside the input dataset {i}"
                ));
            }
            if let Some(i) = first(&self.inputs, |i| i.canon == o.canon) {
                return err(format!("output {what} '{od}' is the input {i}"));
            }
        }
        Ok(())
    }
}

/// Directories of the system that no output may go to (nor lie directly in): seistomo writes
/// a set of files, a manifest and a lock into an output directory, and removes what it wrote
/// there.
const SYSTEM_DIRS: [&str; 16] = [
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var", "/usr/bin", "/usr/lib",
];

/// Error when `dir` (`what` names it) is a file system root, the home directory or a system
/// directory (symlinks followed).
fn refuse_system_dir(what: &str, dir: &Path) -> Result<()> {
    let c = canonical(dir);
    let why = if c.parent().is_none() {
        Some("the root of the file system")
    } else if crate::settings::launch::home_dir().is_some_and(|h| canonical(&h) == c) {
        Some("the home directory")
    } else if SYSTEM_DIRS.iter().any(|s| c == Path::new(s)) {
        Some("a system directory")
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::Invalid(format!(
            "output {what} '{}' is {why}: refused; give a directory of its own",
            dir.display()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clashes_are_found_through_symlinks_links_and_missing_paths() {
        let d = std::env::temp_dir().join(format!("seistomo-outpaths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("ds/sub")).unwrap();
        std::fs::write(d.join("A.mtx"), "x").unwrap();
        std::os::unix::fs::symlink(d.join("A.mtx"), d.join("link.mtx")).unwrap();
        std::fs::hard_link(d.join("A.mtx"), d.join("hard.mtx")).unwrap();
        let bad = |f: &dyn Fn(&mut PathCheck), want: &str| {
            let mut c = PathCheck::new();
            c.input("--matrix", &d.join("A.mtx"))
                .input_dir("[dataset] path", &d.join("ds"));
            f(&mut c);
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        // One output each, clashing with the inputs.
        for (flag, out, want) in [
            ("--solution", "A.mtx", "is the input --matrix"),
            ("--solution", "link.mtx", "is the input"),
            ("--solution", "hard.mtx", "is the input"),
            (
                "--solution",
                "ds/sub/../new/x.txt",
                "inside the input dataset",
            ),
            ("--report", "ds", "existing directory"),
            ("--report", "seistomo-outputs.json", "reserved"),
        ] {
            bad(
                &|c| {
                    c.output(flag, &d.join(out));
                },
                want,
            );
        }
        bad(
            &|c| {
                c.output("--solution", &d.join("x"))
                    .output("--report", &d.join("./x"));
            },
            "are the same file",
        );
        bad(
            &|c| {
                c.output_dir("-o", &d.join("ds/sub"));
            },
            "inside the input dataset",
        );
        let mut ok = PathCheck::new();
        ok.input("--matrix", &d.join("A.mtx"))
            .output("--solution", &d.join("new/dir/x.txt"))
            .output("--report", &d.join("new/dir/r.json"));
        ok.check().unwrap();
        assert_eq!(ok.output_parents(), vec![d.join("new/dir")]);
        assert_eq!(
            canonical(&d.join("new/../A.mtx")),
            d.join("A.mtx").canonicalize().unwrap()
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
