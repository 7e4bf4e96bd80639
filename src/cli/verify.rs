//! `seistomo verify DATASET`: check a whole dataset (structure, values and, in format version
//! 2, every checksum) and its prepared storage (`seistomo prepare`) without solving. Exit 0 and one line when it is intact; else one line
//! naming the file and the row, exit 1.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Dataset (dataset.toml or its directory).
    dataset: PathBuf,
}

pub fn run(a: VerifyArgs) -> anyhow::Result<()> {
    let r = crate::io::dataset::verify::verify_dataset(&a.dataset, true)?;
    let what = if r.version >= 3 {
        format!(
            "every checksum matches and every file carries the dataset id {}",
            crate::io::dataset::binfmt::id_text(r.id)
        )
    } else if r.version == 2 {
        "every checksum matches; format version 2 has no dataset id, so a file copied from another dataset of the same shape cannot be told apart (rewrite it with `seistomo import`/`synth` for version 3)".to_string()
    } else {
        "structure and values checked; format version 1 has no checksums, so a bit flip that leaves a value finite cannot be detected (rewrite it with `seistomo import`/`synth` for version 3)".to_string()
    };
    let (prep_files, prep_bytes) = crate::pipeline::prepared::verify_all(&a.dataset)?;
    let what = if prep_files > 0 {
        format!(
            "{what}; {prep_files} prepared-storage file(s) ({:.1} MB) intact",
            prep_bytes as f64 / 1e6
        )
    } else {
        what
    };
    println!(
        "{}: OK (format version {}): {} kernel rows, {} nonzeros, {} damping rows, {} files, {:.1} MB in {:.2} s ({:.2} GB/s); {what}",
        a.dataset.display(),
        r.version,
        r.kernel_rows,
        r.kernel_nnz,
        r.damping_rows,
        r.files,
        r.bytes as f64 / 1e6,
        r.seconds,
        if r.seconds > 0.0 { r.bytes as f64 / r.seconds / 1e9 } else { 0.0 }
    );
    Ok(())
}
