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
        self.inputs.push(entry(what, p));
        self
    }

    /// An input file that may be absent.
    pub fn input_opt(&mut self, what: &str, p: Option<&Path>) -> &mut Self {
        if let Some(p) = p {
            self.input(what, p);
        }
        self
    }

    /// An input directory (a dataset): no output may lie inside it.
    pub fn input_dir(&mut self, what: &str, p: &Path) -> &mut Self {
        self.input_dirs.push(entry(what, p));
        self
    }

    /// An output file.
    pub fn output(&mut self, what: &str, p: &Path) -> &mut Self {
        self.outputs.push(entry(what, p));
        self
    }

    /// An output file that may be absent.
    pub fn output_opt(&mut self, what: &str, p: Option<&Path>) -> &mut Self {
        if let Some(p) = p {
            self.output(what, p);
        }
        self
    }

    /// A directory that receives outputs (`export -o`, `synth --out`): it must not be an input,
    /// hold one, or lie inside an input dataset.
    pub fn output_dir(&mut self, what: &str, p: &Path) -> &mut Self {
        self.output_dirs.push(entry(what, p));
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

    /// Refuse any clash (module docs); one line naming both paths.
    pub fn check(&self) -> Result<()> {
        let err = |msg: String| Err(Error::Invalid(msg));
        for (k, o) in self.outputs.iter().enumerate() {
            let od = o.shown.display();
            if let Ok(m) = std::fs::metadata(&o.shown) {
                if m.is_dir() {
                    return err(format!("output {} '{od}' is an existing directory", o.what));
                }
                if !m.is_file() {
                    return err(format!(
                        "output {} '{od}' exists and is not a regular file",
                        o.what
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
                    "output {} '{od}': the name {name} is reserved for seistomo's own files",
                    o.what
                ));
            }
            for i in &self.inputs {
                if i.canon == o.canon || (i.id.is_some() && i.id == o.id) {
                    return err(format!(
                        "output {} '{od}' is the input {} '{}': refusing to overwrite an input",
                        o.what,
                        i.what,
                        i.shown.display()
                    ));
                }
            }
            for i in &self.input_dirs {
                if o.canon.starts_with(&i.canon) {
                    return err(format!(
                        "output {} '{od}' lies inside the input dataset {} '{}'",
                        o.what,
                        i.what,
                        i.shown.display()
                    ));
                }
            }
            for p in &self.outputs[..k] {
                if p.canon == o.canon || (p.id.is_some() && p.id == o.id) {
                    return err(format!(
                        "outputs {} and {} are the same file '{od}'",
                        p.what, o.what
                    ));
                }
            }
        }
        for o in &self.output_dirs {
            let od = o.shown.display();
            if o.shown.exists() && !o.shown.is_dir() {
                return err(format!("output {} '{od}' is not a directory", o.what));
            }
            for i in &self.input_dirs {
                if o.canon.starts_with(&i.canon) {
                    return err(format!(
                        "output {} '{od}' is or lies inside the input dataset {} '{}'",
                        o.what,
                        i.what,
                        i.shown.display()
                    ));
                }
            }
            for i in &self.inputs {
                if i.canon == o.canon {
                    return err(format!(
                        "output {} '{od}' is the input {} '{}'",
                        o.what,
                        i.what,
                        i.shown.display()
                    ));
                }
            }
        }
        Ok(())
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
        bad(
            &|c| {
                c.output("--solution", &d.join("A.mtx"));
            },
            "is the input --matrix",
        );
        bad(
            &|c| {
                c.output("--solution", &d.join("link.mtx"));
            },
            "is the input",
        );
        bad(
            &|c| {
                c.output("--solution", &d.join("hard.mtx"));
            },
            "is the input",
        );
        bad(
            &|c| {
                c.output("--solution", &d.join("ds/sub/../new/x.txt"));
            },
            "inside the input dataset",
        );
        bad(
            &|c| {
                c.output("--report", &d.join("ds"));
            },
            "existing directory",
        );
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
        bad(
            &|c| {
                c.output("--report", &d.join("seistomo-outputs.json"));
            },
            "reserved",
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
