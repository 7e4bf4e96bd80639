//! Build script: the git commit of the source tree, for the provenance of model files
//! (src/model/provenance.rs). Without git or a .git (a source tarball) the commit comes from
//! $SEISTOMO_GIT_COMMIT, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SEISTOMO_GIT_COMMIT");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = std::env::var("SEISTOMO_GIT_COMMIT").ok().or_else(|| {
        let head = git(&["rev-parse", "HEAD"])?;
        // Rebuild when HEAD or the branch it points to moves.
        if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
            println!("cargo:rerun-if-changed={dir}/HEAD");
            let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or(dir);
            if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={common}/{r}");
            }
        }
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        Some(if dirty { format!("{head}-dirty") } else { head })
    });
    println!(
        "cargo:rustc-env=SEISTOMO_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
