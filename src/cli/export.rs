//! `seistomo export`: a dataset's assembled system [W G; λ R] x = [W d; 0] as Matrix Market or
//! NumPy files.

use std::path::PathBuf;

use clap::Args;

use crate::io::npy::write_npy;
use crate::io::{load_dataset_with, LoadOptions};
use crate::sparse::mtx;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Dataset (dataset.toml or its directory).
    dataset: PathBuf,
    /// mtx (A.mtx + b.mtx) or npy (indptr, indices, data, b, shape .npy).
    #[arg(long, default_value = "mtx")]
    format: String,
    /// Output directory (created).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    if a.format != "mtx" && a.format != "npy" {
        anyhow::bail!("--format '{}': expected mtx or npy", a.format);
    }
    let opts = LoadOptions {
        progress: true,
        ..Default::default()
    };
    let (sys, _) = load_dataset_with(&a.dataset, 0, 1, &opts)?;
    std::fs::create_dir_all(&a.out).map_err(|e| crate::Error::io(&a.out, e))?;
    let s = &sys.a;
    if a.format == "mtx" {
        mtx::write_matrix(a.out.join("A.mtx"), s, "exported by seistomo")?;
        mtx::write_vector_mtx(a.out.join("b.mtx"), &sys.b)?;
    } else {
        let ip: Vec<i64> = s.indptr().iter().map(|&p| p as i64).collect();
        write_npy(&a.out.join("indptr.npy"), &ip)?;
        if s.ncols() <= i32::MAX as usize {
            let ix: Vec<i32> = s.indices().iter().map(|&c| c as i32).collect();
            write_npy(&a.out.join("indices.npy"), &ix)?;
        } else {
            let ix: Vec<i64> = s.indices().iter().map(|&c| c as i64).collect();
            write_npy(&a.out.join("indices.npy"), &ix)?;
        }
        write_npy(&a.out.join("data.npy"), s.data())?;
        write_npy(&a.out.join("b.npy"), &sys.b)?;
        write_npy(
            &a.out.join("shape.npy"),
            &[s.nrows() as i64, s.ncols() as i64],
        )?;
    }
    eprintln!(
        "export: {} x {} system ({} kernel rows), {} nonzeros -> {} ({})",
        s.nrows(),
        s.ncols(),
        sys.kernel_rows,
        s.nnz(),
        a.out.display(),
        a.format
    );
    Ok(())
}
