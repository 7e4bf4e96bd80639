//! Helpers of the GPU tests (tests/gpu.rs, tests/gpu_compact.rs, tests/gpu_gmres.rs).

use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::cuda::{probe, CudaBackend};
use seistomo::backend::{Backend, Operator, Scale};
use seistomo::grid::Rng;
use seistomo::io::mtx::load_system as load_mtx_system;
use seistomo::solver::LsqrParams;
use seistomo::sparse::System;
use std::path::PathBuf;

/// The CUDA backend on device 0. The tests that call it are `#[ignore]`d and run only when
/// asked for (`--include-ignored`, on the GPU machine): without a usable GPU they fail, saying
/// why, instead of passing without having run.
pub fn gpu() -> CudaBackend {
    match probe() {
        Err(why) => panic!(
            "no usable CUDA GPU ({why}): this GPU test runs only where there is one (it is \
             #[ignore]d; --include-ignored asked for it)"
        ),
        Ok(dev) => {
            println!("running on {dev}");
            CudaBackend::new(0).expect("probe succeeded, so the backend must start")
        }
    }
}

/// n values uniform in [-1, 1).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.uniform() * 2.0 - 1.0).collect()
}

/// ||a - b|| / ||b|| (||a - b|| when b = 0).
pub fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// A device vector on the host.
pub fn down(be: &CudaBackend, x: &<CudaBackend as Backend>::Vector) -> Vec<f64> {
    let mut h = vec![0.0; be.len(x)];
    be.download(x, &mut h).unwrap();
    h
}

/// The same product through a CPU and a GPU operator from the same start: y = alpha A x + beta y,
/// or with `transpose` x = alpha A^T y + beta x (`inp` the vector multiplied, `out` the start of
/// the result). Returns (the GPU's result on the host, the CPU's).
#[allow(clippy::too_many_arguments)]
pub fn products<C: Operator<CpuBackend>, G: Operator<CudaBackend>>(
    (c, cop): (&CpuBackend, &C),
    (g, gop): (&CudaBackend, &G),
    transpose: bool,
    alpha: f64,
    inp: &[f64],
    beta: f64,
    out: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (ci, mut co) = (inp.to_vec(), out.to_vec());
    let gi = g.upload(inp).unwrap();
    let mut go = g.upload(out).unwrap();
    if transpose {
        cop.apply_t(c, Scale::new(alpha, beta), &ci, &mut co)
            .unwrap();
        gop.apply_t(g, Scale::new(alpha, beta), &gi, &mut go)
            .unwrap();
    } else {
        cop.apply(c, Scale::new(alpha, beta), &ci, &mut co).unwrap();
        gop.apply(g, Scale::new(alpha, beta), &gi, &mut go).unwrap();
    }
    (down(g, &go), co)
}

/// The repository (SEISTOMO_ROOT overrides, so that a copied test binary finds the datasets on
/// another machine).
pub fn data_root() -> PathBuf {
    std::env::var_os("SEISTOMO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The real systems the GPU solves are checked on, as (name, system, LSQR parameters):
/// australia ([G; 0.015 R], [d; 0]) to atol = btol = 1e-8 and well1850 to 1e-10. A missing
/// file fails the test (a copied test binary needs SEISTOMO_ROOT).
pub fn real_systems() -> Vec<(&'static str, System, LsqrParams)> {
    let mut paths = Vec::new();
    for p in [
        "datasets/australia/G.mtx.gz",
        "datasets/australia/d.txt",
        "datasets/australia/R.mtx.gz",
        "datasets/lsq/well1850.mtx.gz",
        "datasets/lsq/well1850_rhs1.mtx.gz",
    ] {
        let path = data_root().join(p);
        assert!(
            path.exists(),
            "{} missing (set SEISTOMO_ROOT to the repository)",
            path.display()
        );
        paths.push(path);
    }
    let [g, d, r, w, wr] = &paths[..] else {
        unreachable!()
    };
    let tol = |t: f64| LsqrParams {
        atol: t,
        btol: t,
        ..Default::default()
    };
    vec![
        (
            "australia",
            load_mtx_system(g, Some(d), Some(r), 0.015).unwrap(),
            tol(1e-8),
        ),
        (
            "well1850",
            load_mtx_system(w, Some(wr), None, 1.0).unwrap(),
            tol(1e-10),
        ),
    ]
}
