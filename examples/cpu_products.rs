//! One core's sparse products on a Matrix Market system [A; w R], each timed REPS times with
//! the minimum reported (the least disturbed run: on a shared VM single runs vary by 20-30 %):
//!
//!     RAYON_NUM_THREADS=1 cargo run --release --example cpu_products -- \
//!         datasets/australia/G.mtx.gz datasets/australia/R.mtx.gz 0.015 [REPS]
//!     RAYON_NUM_THREADS=1 cargo run --release --example cpu_products -- synth 64,64,40 150000 [REPS]
//!
//! (the second: `seistomo bench --size medium --reorder auto`'s system, out of cache).
//!
//! The products run on a worker of rayon's pool, as in a solve. Rows: the CPU backend's compact storage (f64 and f32 values) and CSR operators (A x and
//! A^T y, the transpose from their explicit transposed copies), and kernels that are not
//! seistomo's operators, as yardsticks: a bare CSR row loop in the backend's order (`Lanes`,
//! without the operator's thread split and scaling), a plain CSR row loop with one running sum
//! (the loop of a general library such as SciPy's or PETSc's AIJ) and one pass that computes u = A x - u / 2 and
//! A^T u together (each row gathered once, then scattered), which no operator here uses: its
//! sums run in another order than the explicit transpose's, so its results would depend on
//! the row split and differ from the other products in the last bits.
//! docs/performance.md ("CPU, one thread") records what they measured.
use std::time::Instant;

use seistomo::backend::cpu::{CpuBackend, CpuCompactOperator, CpuCsrOperator};
use seistomo::backend::{Operator, Precision, Scale, TransposeStrategy};
use seistomo::sparse::{Csr, Lanes, RowSort};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // On a worker of rayon's pool, as a solve runs (seistomo::backend::cpu::on_pool): called
    // from outside the pool, every product would wait for a wake-up of a worker.
    rayon::scope(|_| run().map_err(|e| e.to_string()))?;
    Ok(())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err(
            "usage: cpu_products A.mtx R.mtx WEIGHT [REPS] | cpu_products synth NX,NY,NZ RAYS [REPS]"
                .into(),
        );
    }
    let a = if args[0] == "synth" {
        synthetic(&args[1], args[2].parse()?)?
    } else {
        let a = seistomo::io::mtx::read_matrix(&args[0])?;
        let r = seistomo::io::mtx::read_matrix(&args[1])?;
        a.vstack_scaled(&r, args[2].parse()?)?
    };
    let reps: usize = args.get(3).map_or(Ok(2000), |s| s.parse())?;
    println!(
        "{} x {}, {} nonzeros, minimum of {reps} runs, ms",
        a.nrows(),
        a.ncols(),
        a.nnz()
    );
    let be = CpuBackend::new();
    let x: Vec<f64> = (0..a.ncols()).map(|i| (i as f64 * 0.37).sin()).collect();
    let y: Vec<f64> = (0..a.nrows()).map(|i| (i as f64 * 0.11).cos()).collect();
    let ops: Vec<(&str, Box<dyn Operator<CpuBackend>>)> = vec![
        (
            "compact f64",
            Box::new(CpuCompactOperator::new(&a, None, Precision::F64)),
        ),
        (
            "compact f32",
            Box::new(CpuCompactOperator::new(&a, None, Precision::F32)),
        ),
        (
            "csr f64",
            Box::new(CpuCsrOperator::new(a.clone(), TransposeStrategy::Csc)),
        ),
        (
            "compact f64, rows as read",
            Box::new(CpuCompactOperator::with_row_sort(
                &a,
                None,
                Precision::F64,
                RowSort::Keep,
            )),
        ),
        (
            "csr f64, rows as read",
            Box::new(CpuCsrOperator::with_row_sort(
                a.clone(),
                TransposeStrategy::Csc,
                RowSort::Keep,
            )),
        ),
    ];
    let scale = Scale::new(1.0, -0.5);
    for (name, op) in &ops {
        let (mut u, mut v) = (y.clone(), x.clone());
        let ax = best(reps, || op.apply(&be, scale, &x, &mut u).map(|_| ()))?;
        let aty = best(reps, || op.apply_t(&be, scale, &y, &mut v).map(|_| ()))?;
        println!(
            "{name:24} A x {ax:.4}  A^T y {aty:.4}  both {:.4}",
            ax + aty
        );
    }
    let at = a.transpose();
    // each row sum its own function item (not a fn pointer): inlined into the row loop
    time_rows("bare loop, 4 lanes", (&a, &at), (&x, &y), reps, lanes_sum)?;
    time_rows("plain row loop", (&a, &at), (&x, &y), reps, running_sum)?;
    let (mut u, mut w) = (y.clone(), vec![0.0; a.ncols()]);
    let fused = best(reps, || {
        one_pass(&a, &x, &mut u, &mut w);
        Ok(())
    })?;
    println!("{:24} both {fused:.4}", "one pass A x, A^T u");
    Ok(())
}

/// `seistomo bench`'s straight-ray system on grid `g` ("NX,NY,NZ") with `rays` rays and its
/// damping rows, reordered as `invert --reorder auto` does (an out-of-cache system when large).
fn synthetic(g: &str, rays: usize) -> Result<Csr, Box<dyn std::error::Error>> {
    let n: Vec<usize> = g.split(',').map(|t| t.parse()).collect::<Result<_, _>>()?;
    let [nx, ny, nz] = n[..] else {
        return Err(format!("{g}: expected NX,NY,NZ").into());
    };
    let a = seistomo::grid::synthetic::peer_system(nx, ny, nz, rays, 7, false);
    let b = vec![0.0; a.nrows()];
    let p = seistomo::backend::storage::prepare(
        a,
        b,
        rays,
        Some([nx, ny, nz]),
        seistomo::backend::storage::Storage::Csr,
        seistomo::grid::reorder::Reorder::Auto,
        true,
        Default::default(),
    );
    Ok(p.matrix.rows.into_csr()?)
}

/// Prints the least times of A x and A^T y by `rows` with row sums `row` (`at`: A^T as rows).
fn time_rows(
    name: &str,
    (a, at): (&Csr, &Csr),
    (x, y): (&[f64], &[f64]),
    reps: usize,
    row: impl Fn(&Csr, &[f64], usize) -> f64 + Copy,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut u, mut v) = (y.to_vec(), x.to_vec());
    let ax = best(reps, || {
        rows(a, x, &mut u, row);
        Ok(())
    })?;
    let aty = best(reps, || {
        rows(at, y, &mut v, row);
        Ok(())
    })?;
    println!(
        "{name:24} A x {ax:.4}  A^T y {aty:.4}  both {:.4}",
        ax + aty
    );
    Ok(())
}

/// The least time of `reps` calls of `f`, in ms.
fn best(
    reps: usize,
    mut f: impl FnMut() -> seistomo::Result<()>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut t = f64::MAX;
    for _ in 0..reps {
        let s = Instant::now();
        f()?;
        t = t.min(s.elapsed().as_secs_f64() * 1e3);
    }
    Ok(t)
}

/// Entry k of A times x at its column.
#[inline(always)]
fn term(a: &Csr, x: &[f64], k: usize) -> f64 {
    let (ci, va) = (a.indices(), a.data());
    debug_assert!(k < a.nnz() && x.len() >= a.ncols());
    // SAFETY: callers pass k < nnz (within a valid Csr's row offsets) and assert
    // x.len() >= ncols, which bounds every column.
    unsafe { va.get_unchecked(k) * x.get_unchecked(*ci.get_unchecked(k) as usize) }
}

/// Row i of A x with one running sum.
#[inline(always)]
fn running_sum(a: &Csr, x: &[f64], i: usize) -> f64 {
    let ip = a.indptr();
    (ip[i] as usize..ip[i + 1] as usize).fold(0.0, |s, k| s + term(a, x, k))
}

/// Row i of A x in the CPU backend's order (`Lanes`).
#[inline(always)]
fn lanes_sum(a: &Csr, x: &[f64], i: usize) -> f64 {
    let (s, e) = (a.indptr()[i] as usize, a.indptr()[i + 1] as usize);
    Lanes::of(e - s, |k| term(a, x, s + k)).sum()
}

/// u = A x - u / 2, row i summed by `row`.
#[inline(always)]
fn rows(a: &Csr, x: &[f64], u: &mut [f64], row: impl Fn(&Csr, &[f64], usize) -> f64) {
    assert!(x.len() >= a.ncols() && u.len() >= a.nrows());
    for (i, ui) in u.iter_mut().enumerate().take(a.nrows()) {
        *ui = row(a, x, i) - 0.5 * *ui;
    }
}

/// u = A x - u / 2 and w = A^T u in one pass over the rows.
fn one_pass(a: &Csr, x: &[f64], u: &mut [f64], w: &mut [f64]) {
    assert!(x.len() >= a.ncols() && w.len() >= a.ncols() && u.len() >= a.nrows());
    let (ip, ci, va) = (a.indptr(), a.indices(), a.data());
    w.iter_mut().for_each(|v| *v = 0.0);
    for (i, ui) in u.iter_mut().enumerate().take(a.nrows()) {
        let r = running_sum(a, x, i) - 0.5 * *ui;
        *ui = r;
        for k in ip[i] as usize..ip[i + 1] as usize {
            // SAFETY: k < nnz (a valid Csr's offsets) and every column < ncols <= w.len()
            // (asserted above).
            unsafe {
                *w.get_unchecked_mut(*ci.get_unchecked(k) as usize) += va.get_unchecked(k) * r
            };
        }
    }
}
