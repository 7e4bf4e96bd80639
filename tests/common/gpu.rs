//! Helpers of the GPU tests (tests/gpu.rs, tests/gpu_gmres.rs).

use seistomo::backend::cuda::{probe, CudaBackend};
use seistomo::backend::Backend;
use seistomo::grid::Rng;

/// The CUDA backend on device 0, or None after printing why the test is skipped.
pub fn gpu() -> Option<CudaBackend> {
    match probe() {
        Err(why) => {
            println!("skipped: no CUDA GPU ({why})");
            None
        }
        Ok(dev) => {
            println!("running on {dev}");
            Some(CudaBackend::new(0).expect("probe succeeded, so the backend must start"))
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
