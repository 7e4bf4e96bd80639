//! Paths as people write them: `configs/../out/model.h5` becomes `out/model.h5`.

use std::path::{Component, Path, PathBuf};

/// Drop `.` components and fold `dir/..` where `dir` is a real directory (not a symbolic link,
/// whose `..` may lie elsewhere) or does not exist yet, so the tidy path names the same file.
/// Leading `..` and absolute roots are kept.
pub fn tidy(path: impl AsRef<Path>) -> PathBuf {
    let mut out = PathBuf::new();
    // Whether the last component of `out` is a normal name that `..` may cancel.
    let mut names: Vec<bool> = Vec::new();
    for c in path.as_ref().components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let foldable = names.last() == Some(&true)
                    && !std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink());
                if foldable {
                    out.pop();
                    names.pop();
                } else {
                    out.push("..");
                    names.push(false);
                }
            }
            Component::Normal(n) => {
                out.push(n);
                names.push(true);
            }
            other => {
                out.push(other.as_os_str());
                names.push(false);
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::tidy;
    use std::path::Path;

    #[test]
    fn folds_dot_dot_after_names() {
        assert_eq!(tidy("configs/../out/m.h5"), Path::new("out/m.h5"));
        assert_eq!(tidy("./a/./b"), Path::new("a/b"));
        assert_eq!(tidy("../a/../b"), Path::new("../b"));
        assert_eq!(tidy("/x/y/../z"), Path::new("/x/z"));
        assert_eq!(tidy("a/.."), Path::new("."));
    }
}
