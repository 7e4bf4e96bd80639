//! GMRES on the CUDA backend against the CPU backend (the reference): the batched Gram-Schmidt
//! kernels, the ILU(0) Jacobi sweeps, whole GMRES solves on one GPU and on several simulated
//! ranks (threads sharing the GPU), and the CLI. Every test needs a GPU, so it is `#[ignore]`d
//! (counted as ignored where there is none) and runs with `--include-ignored` on the GPU
//! machine (bench/gpu.sh tests), where it fails if no usable GPU is found.

mod common;

use common::gpu::{down, gpu, rand_vec, rel};
use common::seistomo_path as bin;
use common::{iterations_within, on_thread_ranks, GMRES_JACOBI_CLI};
use std::path::PathBuf;

use seistomo::backend::cpu::square::DistSquareOperator;
use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::cuda::{CudaBackend, CudaIluSweeps, CudaSquareOperator};
use seistomo::backend::precond::{BlockIlu0, PivotPolicy, Preconditioner, TriSolve};
use seistomo::backend::storage::Storage;
use seistomo::backend::{Backend, Measure, Operator, Precision, ScalarSlots, Scale};
use seistomo::comm::{Comm, SerialComm};
use seistomo::io::mtx;
use seistomo::partition::graph::RowPartition;
use seistomo::pipeline::operators::{Engine, SquareSystem};
use seistomo::pipeline::options::OperatorSpec;
use seistomo::pipeline::square::gmres_square;
use seistomo::solver::dist_square::{SquarePrecond, SquareSolve};
use seistomo::solver::gmres::{
    ArnoldiLoop, ConvergenceTest, GmresParams, NoGmresMonitor, Orthog, PrecondSide,
};
use seistomo::sparse::patterns::{PatternLimits, RowPatterns};
use seistomo::sparse::Csr;
use seistomo::testproblems::square::{cube, SquareKind};

/// The repository (SEISTOMO_ROOT lets a copied test binary find it on the GPU machine).
fn root() -> PathBuf {
    std::env::var_os("SEISTOMO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// |got - want| small against the sum of the magnitudes of the summed products.
fn close_sums(got: &[f64], want: &[f64], scale: &[f64], what: &str) {
    for (j, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (g - w).abs() <= 1e-13 * s.max(1e-300),
            "{what}[{j}]: {g:e} vs {w:e} (scale {s:e})"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn batched_gram_schmidt_kernels_match_cpu() {
    let be = gpu();
    let cpu = CpuBackend::new();
    for &n in &[1usize, 999, 300_001] {
        for &k in &[1usize, 5, 17, 32, 33, 40] {
            let seed = (n * 100 + k) as u64;
            let basis_h: Vec<Vec<f64>> = (0..k).map(|j| rand_vec(n, seed + j as u64)).collect();
            let w_h = rand_vec(n, seed + 1000);
            let coef: Vec<f64> = rand_vec(k, seed + 2000);
            let basis_d: Vec<_> = basis_h.iter().map(|v| be.upload(v).unwrap()).collect();
            // magnitude scale of each inner product
            let scale = |w: &[f64]| -> Vec<f64> {
                basis_h
                    .iter()
                    .map(|v| v.iter().zip(w).map(|(a, b)| (a * b).abs()).sum())
                    .collect()
            };

            // multi_dot
            let mut want = vec![0.0; k];
            cpu.multi_dot(&basis_h, &w_h, &mut want).unwrap();
            let wd = be.upload(&w_h).unwrap();
            let mut got = vec![0.0; k];
            be.multi_dot(&basis_d, &wd, &mut got).unwrap();
            close_sums(&got, &want, &scale(&w_h), &format!("multi_dot n={n} k={k}"));
            assert_eq!(down(&be, &wd), w_h, "multi_dot wrote w");

            // multi_axpy: the same order of updates as the CPU, bit for bit
            let mut wc = w_h.clone();
            cpu.multi_axpy(&coef, &basis_h, &mut wc).unwrap();
            let mut wd = be.upload(&w_h).unwrap();
            be.multi_axpy(&coef, &basis_d, &mut wd).unwrap();
            let wg = down(&be, &wd);
            assert!(
                wg.iter().zip(&wc).all(|(a, b)| a.to_bits() == b.to_bits()),
                "multi_axpy n={n} k={k}: rel {:e}",
                rel(&wg, &wc)
            );

            // multi_axpy_dot
            let mut wc = w_h.clone();
            let mut want = vec![0.0; k];
            cpu.multi_axpy_measure(Measure::Dots, &coef, &basis_h, &mut wc, &mut want)
                .unwrap();
            let mut wd = be.upload(&w_h).unwrap();
            let mut got = vec![0.0; k];
            be.multi_axpy_measure(Measure::Dots, &coef, &basis_d, &mut wd, &mut got)
                .unwrap();
            let wg = down(&be, &wd);
            assert!(
                wg.iter().zip(&wc).all(|(a, b)| a.to_bits() == b.to_bits()),
                "multi_axpy_dot update n={n} k={k}"
            );
            close_sums(
                &got,
                &want,
                &scale(&wc),
                &format!("multi_axpy_dot n={n} k={k}"),
            );

            // multi_axpy_norm_sq
            let mut wc = w_h.clone();
            let (mut want, mut got) = ([0.0], [0.0]);
            cpu.multi_axpy_measure(Measure::NormSq, &coef, &basis_h, &mut wc, &mut want)
                .unwrap();
            let mut wd = be.upload(&w_h).unwrap();
            be.multi_axpy_measure(Measure::NormSq, &coef, &basis_d, &mut wd, &mut got)
                .unwrap();
            let (want, got) = (want[0], got[0]);
            assert!(
                (got - want).abs() <= 1e-13 * want,
                "norm n={n} k={k}: {got:e} vs {want:e}"
            );
            assert_eq!(down(&be, &wd), wc, "multi_axpy_norm_sq update n={n} k={k}");
        }
    }
}

/// The systems the GPU GMRES is checked on: generated ones and the SuiteSparse set.
fn systems() -> Vec<(String, Csr)> {
    let mut v = vec![
        (
            "convdiff12 (generated)".to_string(),
            cube(SquareKind::Convdiff, 12).unwrap(),
        ),
        (
            "poisson10 (generated)".to_string(),
            cube(SquareKind::Poisson, 10).unwrap(),
        ),
    ];
    for f in [
        "datasets/square_gen/convdiff16.mtx.gz",
        "datasets/square/west0479.mtx.gz",
        "datasets/square/nnc1374.mtx.gz",
        "datasets/square/bayer10.mtx.gz",
    ] {
        v.push((f.to_string(), mtx::read_matrix(root().join(f)).unwrap()));
    }
    v
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn ilu_jacobi_sweeps_match_cpu() {
    let be = gpu();
    for (name, a) in systems() {
        let n = a.nrows();
        for sweeps in [1usize, 2, 3, 5] {
            let mut f =
                BlockIlu0::new(&a, n, 0, PivotPolicy::Shift, TriSolve::Jacobi(sweeps)).unwrap();
            let mut d = CudaIluSweeps::new(&be, &f).unwrap();
            let r = rand_vec(n, sweeps as u64 + n as u64);
            let mut want = vec![0.0; n];
            f.solve(&r, &mut want);
            let rd = be.upload(&r).unwrap();
            let mut zd = be.zeros(n).unwrap();
            d.apply(&be, &rd, &mut zd).unwrap();
            let got = down(&be, &zd);
            let bitwise = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let e = rel(&got, &want);
            println!("{name}: {sweeps} sweeps: rel diff {e:e}, bitwise equal {bitwise}");
            assert!(e <= 1e-14, "{name} {sweeps} sweeps: rel diff {e:e}");
        }
    }
    // exact triangular solves are refused on the GPU with a clear message
    let a = cube(SquareKind::Poisson, 4).unwrap();
    let f = BlockIlu0::new(&a, a.nrows(), 0, PivotPolicy::Error, TriSolve::Exact).unwrap();
    let e = CudaIluSweeps::new(&be, &f).err().unwrap().to_string();
    assert!(e.contains("--ilu-sweeps"), "{e}");
}

fn params(orthog: Orthog, side: PrecondSide) -> GmresParams {
    GmresParams {
        restart: 16,
        rtol: 1e-10,
        atol: 0.0,
        max_iter: 16 * 60,
        max_cycles: Some(60),
        orthog,
        side,
        test: ConvergenceTest::Preconditioned,
        arnoldi_loop: ArnoldiLoop::Auto,
    }
}

fn precond(name: &str) -> SquarePrecond {
    match name {
        "jacobi" => SquarePrecond::Jacobi,
        "block-ilu0" => SquarePrecond::BlockIlu0 {
            pivot: PivotPolicy::Shift,
            tri: TriSolve::Jacobi(3),
        },
        _ => SquarePrecond::None,
    }
}

fn solve_cpu(a: &Csr, pc: &str, p: &GmresParams) -> SquareSolve {
    let part = RowPartition::contiguous(a.nrows(), 1);
    let b = vec![1.0; a.nrows()];
    gmres_square(
        &Engine::cpu_on_calling_thread(),
        &SerialComm,
        SquareSystem {
            rows: a,
            part: &part,
            b: &b,
            x0: None,
        },
        precond(pc),
        &OperatorSpec::default(),
        p,
        &mut NoGmresMonitor,
    )
    .unwrap()
}

fn solve_gpu_as(
    _be: &CudaBackend,
    comm: &dyn Comm,
    a: &Csr,
    part: &RowPartition,
    pc: &str,
    p: &GmresParams,
    storage: OperatorSpec,
) -> SquareSolve {
    let rows: Vec<usize> = part.range(comm.rank()).collect();
    let b = vec![1.0; rows.len()];
    // the factory's engine on the same GPU (each solve builds its operator there)
    let engine = Engine::gpu(0).unwrap();
    gmres_square(
        &engine,
        comm,
        SquareSystem {
            rows: &a.select_rows(&rows),
            part,
            b: &b,
            x0: None,
        },
        precond(pc),
        &storage,
        p,
        &mut NoGmresMonitor,
    )
    .unwrap()
}

/// "N its relres R" of a solve.
fn its(s: &SquareSolve) -> String {
    format!(
        "{} its relres {:.3e}",
        s.info.stop.iterations, s.info.stop.relres
    )
}

/// [`solve_gpu_as`] with the default storage (auto: row patterns where the rows qualify).
fn solve_gpu(
    be: &CudaBackend,
    comm: &dyn Comm,
    a: &Csr,
    part: &RowPartition,
    pc: &str,
    p: &GmresParams,
) -> SquareSolve {
    solve_gpu_as(be, comm, a, part, pc, p, OperatorSpec::default())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn gmres_on_the_gpu_matches_the_cpu() {
    let be = gpu();
    for (name, a) in systems() {
        let part = RowPartition::contiguous(a.nrows(), 1);
        for pc in ["none", "jacobi", "block-ilu0"] {
            for orthog in [Orthog::Mgs, Orthog::Cgs2, Orthog::Cgs, Orthog::Dcgs2] {
                for side in [PrecondSide::Left, PrecondSide::Right] {
                    let p = params(orthog, side);
                    let c = solve_cpu(&a, pc, &p);
                    let g = solve_gpu(&be, &SerialComm, &a, &part, pc, &p);
                    let d = rel(&g.x_local, &c.x_local);
                    println!(
                        "{name} {pc} {orthog:?} {side:?}: cpu {} its conv {} relres {:.2e}; gpu {} its conv {} relres {:.2e}; rel diff {d:.2e}",
                        c.info.stop.iterations, c.info.stop.converged, c.info.stop.relres,
                        g.info.stop.iterations, g.info.stop.converged, g.info.stop.relres
                    );
                    assert_eq!(
                        g.info.stop.converged, c.info.stop.converged,
                        "{name} {pc} {orthog:?} {side:?}"
                    );
                    assert_eq!(g.precond, c.precond);
                    if c.info.stop.converged {
                        // SpMV and reductions sum in another order: at most one iteration apart
                        // where the last residual sits at the tolerance.
                        let what = format!("{name} {pc} {orthog:?} {side:?}");
                        iterations_within(g.info.stop.iterations, c.info.stop.iterations, 1, &what);
                        if g.info.stop.iterations == c.info.stop.iterations {
                            assert!(d <= 1e-9, "{name} {pc} {orthog:?} {side:?}: rel diff {d:e}");
                        }
                        assert!(
                            g.info.stop.relres <= 1e-9,
                            "{name}: relres {:e}",
                            g.info.stop.relres
                        );
                    } else {
                        assert_eq!(g.info.stop.iterations, c.info.stop.iterations);
                        assert!(g.info.stop.relres.is_finite());
                    }
                }
            }
        }
    }
}

/// The halo overlap: the product split into interior rows (computed while MPI moves the
/// ghosts) and boundary rows equals the whole product after the exchange and the CPU's, on 2
/// and 3 ranks (threads sharing the GPU), with a beta that reads y.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn split_halo_product_matches_the_whole_one() {
    let be = gpu();
    drop(be);
    let a = cube(SquareKind::Convdiff, 14).unwrap();
    let n = a.nrows();
    let (x, y0) = (rand_vec(n, 11), rand_vec(n, 12));
    let s = Scale::new(1.5, -0.25);
    for ranks in [2usize, 3] {
        for part in [
            RowPartition::contiguous(n, ranks),
            RowPartition::by_nnz(a.indptr(), ranks),
        ] {
            let out = on_thread_ranks(ranks, |c| {
                let range = part.range(c.rank());
                let rows = a.select_rows(&range.clone().collect::<Vec<_>>());
                let cpu = DistSquareOperator::distributed(&rows, &part, c).unwrap();
                let (xl, yl) = (x[range.clone()].to_vec(), y0[range].to_vec());
                let mut want = yl.clone();
                cpu.apply(&CpuBackend::new(), s, &xl, &mut want).unwrap();
                let be = CudaBackend::new(0).unwrap();
                // whole CSR product, split CSR product, row patterns after the exchange
                let got: Vec<Vec<f64>> = [
                    (Storage::Csr, false),
                    (Storage::Csr, true),
                    (Storage::Compact, true),
                ]
                .iter()
                .map(|&(storage, overlap)| {
                    let op = CudaSquareOperator::new(
                        &be,
                        &cpu,
                        c,
                        (Precision::F64, storage),
                        Some(overlap),
                    )
                    .unwrap();
                    if storage == Storage::Compact {
                        assert!(op.storage().starts_with("row patterns"), "{}", op.storage());
                    }
                    let xd = be.upload(&xl).unwrap();
                    let mut yd = be.upload(&yl).unwrap();
                    // twice: the second product reuses the halo buffers
                    op.apply(&be, s, &xd, &mut yd).unwrap();
                    op.apply(&be, Scale::new(1.0, 0.5), &xd, &mut yd).unwrap();
                    if storage == Storage::Compact {
                        // the normalised product after the exchange equals normalising first
                        let sc = be.upload(&[2.5]).unwrap();
                        let n_l = xl.len();
                        let (mut v1, mut y1) = (be.zeros(n_l).unwrap(), be.zeros(n_l).unwrap());
                        be.copy_inv_sqrt(&sc, 0, &xd, &mut v1).unwrap();
                        op.apply(&be, Scale::SET, &v1, &mut y1).unwrap();
                        let (mut xs, mut v2, mut y2) = (
                            be.upload(&xl).unwrap(),
                            be.zeros(n_l).unwrap(),
                            be.zeros(n_l).unwrap(),
                        );
                        op.apply_normalized_scaled_rows(
                            &be,
                            (&sc, 0),
                            &mut xs,
                            &mut v2,
                            None,
                            &mut y2,
                        )
                        .unwrap();
                        assert_eq!(down(&be, &v2), down(&be, &v1), "normalised v on a rank");
                        assert_eq!(
                            down(&be, &y2),
                            down(&be, &y1),
                            "normalised product on a rank"
                        );
                    }
                    down(&be, &yd)
                })
                .collect();
                let mut w2 = want.clone();
                cpu.apply(&CpuBackend::new(), Scale::new(1.0, 0.5), &xl, &mut w2)
                    .unwrap();
                (w2, got)
            });
            for (r, (want, got)) in out.iter().enumerate() {
                let (whole, split, pats) = (&got[0], &got[1], &got[2]);
                let d_whole = rel(whole, want);
                let d_split = rel(split, whole);
                let d_pats = rel(pats, whole);
                println!(
                    "{ranks} ranks, rank {r}: whole vs cpu {d_whole:e}, split vs whole {d_split:e}, row patterns vs whole {d_pats:e}"
                );
                assert!(d_whole <= 1e-14, "whole product vs CPU: {d_whole:e}");
                assert!(d_split <= 1e-14, "split product vs whole: {d_split:e}");
                assert!(d_pats <= 1e-14, "row patterns vs whole: {d_pats:e}");
            }
        }
    }
}

/// A square matrix of 1001 rows (a partial last slice) with empty rows, far columns and
/// columns that wrap around: a few row patterns of 2-3 entries.
fn awkward_patterned() -> Csr {
    let n = 1001usize;
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        if i % 13 == 5 {
            continue;
        }
        let mut cols = vec![i, (i + 517) % n];
        if i > 0 {
            cols.push(i - 1);
        }
        for (k, col) in cols.into_iter().enumerate() {
            r.push(i as u64);
            c.push(col as u64);
            v.push(1.0 + ((i * 7 + k * 3) % 11) as f64 * 0.37);
        }
    }
    Csr::from_triplets(n, n, &r, &c, &v).unwrap()
}

/// Row patterns on the GPU (kernels/spmv.cu pattern_spmv) against their host reference
/// ([`RowPatterns::matvec`], the same order of sums): bit for bit with alpha, a beta that reads
/// y, and the fused row scale, f64 and f32 values, on a stencil matrix and on awkward shapes; and
/// GMRES with row patterns against CSR storage: the same verdict and iterations, x within 1e-9.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn row_patterns_match_their_reference_and_csr() {
    let be = gpu();
    let mats = [
        (
            "convdiff 20^3".to_string(),
            cube(SquareKind::Convdiff, 20).unwrap(),
        ),
        ("awkward 1001".to_string(), awkward_patterned()),
    ];
    let bits = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
    for (name, a) in &mats {
        let n = a.nrows();
        let cpu = DistSquareOperator::serial(a.clone(), &SerialComm).unwrap();
        let (x, y0, dg) = (rand_vec(n, 3), rand_vec(n, 4), rand_vec(n, 5));
        let (xd, dd) = (be.upload(&x).unwrap(), be.upload(&dg).unwrap());
        for prec in [Precision::F64, Precision::F32] {
            let host = RowPatterns::from_csr(a, prec, PatternLimits::default()).unwrap();
            let op =
                CudaSquareOperator::new(&be, &cpu, &SerialComm, (prec, Storage::Compact), None)
                    .unwrap();
            assert_eq!(op.storage(), host.describe());
            let r = host.matvec(&x);
            let want: Vec<f64> = r
                .iter()
                .zip(&y0)
                .map(|(r, y)| 1.5 * r + -0.25 * y)
                .collect();
            let mut yd = be.upload(&y0).unwrap();
            op.apply(&be, Scale::new(1.5, -0.25), &xd, &mut yd).unwrap();
            assert!(
                bits(&down(&be, &yd), &want),
                "{name} {prec}: alpha A x + beta y"
            );
            let want: Vec<f64> = r.iter().zip(&dg).map(|(r, d)| d * r).collect();
            let mut t = be.zeros(n).unwrap();
            be.fill(&mut yd, f64::NAN).unwrap();
            op.apply_scaled_rows(&be, &xd, Some(&dd), &mut t, &mut yd)
                .unwrap();
            assert!(bits(&down(&be, &yd), &want), "{name} {prec}: d .* A x");
            // GMRES's next basis vector normalised inside the product: the same numbers as
            // copy_inv_sqrt followed by the product, bit for bit, with and without the scale
            let sc = be.upload(&[0.0, 3.7, 0.25]).unwrap();
            for dd in [Some(&dd), None] {
                let (mut xs, mut v1, mut y1) = (
                    be.upload(&x).unwrap(),
                    be.zeros(n).unwrap(),
                    be.zeros(n).unwrap(),
                );
                be.copy_inv_sqrt(&sc, 1, &xs, &mut v1).unwrap();
                op.apply_scaled_rows(&be, &v1, dd, &mut t, &mut y1).unwrap();
                let (mut v2, mut y2) = (be.zeros(n).unwrap(), be.zeros(n).unwrap());
                op.apply_normalized_scaled_rows(&be, (&sc, 1), &mut xs, &mut v2, dd, &mut y2)
                    .unwrap();
                assert!(
                    bits(&down(&be, &v2), &down(&be, &v1)),
                    "{name} {prec}: normalised v"
                );
                assert!(
                    bits(&down(&be, &y2), &down(&be, &y1)),
                    "{name} {prec}: normalised product"
                );
            }
            println!("{name} {prec}: {} (products bit for bit)", host.describe());
        }
    }
    let a = cube(SquareKind::Convdiff, 20).unwrap();
    let part = RowPartition::contiguous(a.nrows(), 1);
    for pc in ["none", "jacobi", "block-ilu0"] {
        for prec in [Precision::F64, Precision::F32] {
            let p = params(Orthog::Cgs, PrecondSide::Left);
            let run = |storage| {
                let st = OperatorSpec {
                    precision: prec,
                    storage,
                    ..Default::default()
                };
                solve_gpu_as(&be, &SerialComm, &a, &part, pc, &p, st)
            };
            let (c, g, auto) = (run(Storage::Csr), run(Storage::Compact), run(Storage::Auto));
            let what = format!("{pc} {prec}");
            println!("{what}: csr {}; row patterns {}", its(&c), its(&g));
            assert_eq!(c.storage, "csr");
            assert!(
                g.storage.starts_with("row patterns"),
                "{what}: {}",
                g.storage
            );
            assert_eq!(auto.storage, g.storage, "{what}: auto");
            assert!(c.info.stop.converged && g.info.stop.converged, "{what}");
            iterations_within(g.info.stop.iterations, c.info.stop.iterations, 1, &what);
            let d = rel(&g.x_local, &c.x_local);
            assert!(d <= 1e-9, "{what}: x rel diff {d:e}");
        }
    }
    // a matrix whose rows do not qualify: compact is a clear error, auto keeps CSR
    let (_, ws) = systems()
        .into_iter()
        .find(|(n, _)| n.contains("bayer10"))
        .unwrap();
    assert!(RowPatterns::from_csr(&ws, Precision::F64, PatternLimits::default()).is_err());
    {
        let cpu = DistSquareOperator::serial(ws.clone(), &SerialComm).unwrap();
        let e = CudaSquareOperator::new(
            &be,
            &cpu,
            &SerialComm,
            (Precision::F64, Storage::Compact),
            None,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("row patterns") && e.contains("--storage csr"),
            "{e}"
        );
        let op = CudaSquareOperator::new(
            &be,
            &cpu,
            &SerialComm,
            (Precision::F64, Storage::Auto),
            None,
        )
        .unwrap();
        assert_eq!(op.storage(), "csr");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn gmres_on_several_gpu_ranks_matches_one() {
    let be = gpu();
    drop(be);
    let a = cube(SquareKind::Convdiff, 16).unwrap();
    for (pc, orthog) in [
        ("jacobi", Orthog::Cgs2),
        ("block-ilu0", Orthog::Cgs2),
        ("jacobi", Orthog::Dcgs2),
    ] {
        let p = params(orthog, PrecondSide::Left);
        let one = {
            let be = CudaBackend::new(0).unwrap();
            solve_gpu(
                &be,
                &SerialComm,
                &a,
                &RowPartition::contiguous(a.nrows(), 1),
                pc,
                &p,
            )
        };
        assert!(one.info.stop.converged);
        for ranks in [2usize, 3] {
            for part in [
                RowPartition::contiguous(a.nrows(), ranks),
                RowPartition::by_nnz(a.indptr(), ranks),
            ] {
                let out: Vec<SquareSolve> = on_thread_ranks(ranks, |c| {
                    let be = CudaBackend::new(0).unwrap();
                    solve_gpu(&be, c, &a, &part, pc, &p)
                });
                let x: Vec<f64> = out.iter().flat_map(|s| s.x_local.clone()).collect();
                let its = out[0].info.stop.iterations;
                assert!(out.iter().all(|s| s.info.stop.iterations == its));
                let d = rel(&x, &one.x_local);
                println!(
                    "{pc} on {ranks} GPU ranks: {its} its (one rank {}), rel diff {d:e}",
                    one.info.stop.iterations
                );
                assert!(out[0].info.stop.converged);
                if pc == "jacobi" {
                    // the same preconditioner on any rank count
                    assert!(
                        its.abs_diff(one.info.stop.iterations) <= 1,
                        "{its} vs {}",
                        one.info.stop.iterations
                    );
                    assert!(d <= 1e-9, "rel diff {d:e}");
                } else {
                    // one ILU(0) block per rank: another preconditioner, the same solution
                    assert!(d <= 1e-8, "rel diff {d:e}");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn cli_gmres_on_cuda() {
    let _be = gpu();
    let dir = std::env::temp_dir().join(format!("seistomo-gpu-gmres-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |backend: &str, extra: &[&str]| -> serde_json::Value {
        let rep = dir.join(format!("r-{backend}.json"));
        let reps = rep.to_string_lossy().into_owned();
        let mut args = GMRES_JACOBI_CLI.to_vec();
        args.extend(["--matrix", "datasets/square_gen/convdiff24.mtx.gz"]);
        args.extend(["--backend", backend, "--report", &reps]);
        args.extend_from_slice(extra);
        let o = std::process::Command::new(bin())
            .current_dir(root())
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap()
    };
    let c = run("cpu", &[]);
    let g = run("cuda", &[]);
    let a = run("auto", &[]);
    assert_eq!(g["backend"], "cuda");
    assert_eq!(a["backend"], "cuda");
    assert_eq!(c["backend"], "cpu");
    assert!(g["converged"].as_bool().unwrap());
    let (ci, gi) = (
        c["iterations"].as_u64().unwrap(),
        g["iterations"].as_u64().unwrap(),
    );
    assert!(ci.abs_diff(gi) <= 1, "cpu {ci} vs cuda {gi}");
    // f32 matrix values: the nearby system, still converged
    let f = run("cuda", &["--precision", "f32"]);
    assert!(f["converged"].as_bool().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The left Jacobi preconditioner folded into the product's epilogue equals the product
/// followed by its own pass, bit for bit (f64 and f32 values); and the device Arnoldi loop on
/// the GPU reproduces the host loop exactly: the same iterations and residuals, x bit for bit,
/// also when the iteration limit ends a run inside a cycle and on several ranks.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn fused_jacobi_and_device_arnoldi_loop_match_the_host_path() {
    let be = gpu();
    let a = cube(SquareKind::Convdiff, 20).unwrap();
    let n = a.nrows();
    let cpu = DistSquareOperator::serial(a.clone(), &SerialComm).unwrap();
    let dg = be.upload(&rand_vec(n, 7)).unwrap();
    let x = be.upload(&rand_vec(n, 8)).unwrap();
    for (prec, storage) in [
        (Precision::F64, Storage::Csr),
        (Precision::F32, Storage::Csr),
        (Precision::F64, Storage::Compact),
        (Precision::F32, Storage::Compact),
    ] {
        let op = CudaSquareOperator::new(&be, &cpu, &SerialComm, (prec, storage), None).unwrap();
        let (mut t, mut y1, mut y2) = (
            be.zeros(n).unwrap(),
            be.zeros(n).unwrap(),
            be.zeros(n).unwrap(),
        );
        op.apply(&be, Scale::SET, &x, &mut t).unwrap();
        be.pointwise_mul(&dg, &t, &mut y1).unwrap();
        be.fill(&mut y2, f64::NAN).unwrap();
        op.apply_scaled_rows(&be, &x, Some(&dg), &mut t, &mut y2)
            .unwrap();
        let (h1, h2) = (down(&be, &y1), down(&be, &y2));
        assert!(
            h1.iter().zip(&h2).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{prec} {storage}: fused row scale"
        );
        let mut y3 = be.zeros(n).unwrap();
        op.apply_scaled_rows(&be, &x, None, &mut t, &mut y3)
            .unwrap();
        op.apply(&be, Scale::SET, &x, &mut y1).unwrap();
        assert_eq!(down(&be, &y3), down(&be, &y1), "{prec} {storage}: no scale");
    }
    let part = RowPartition::contiguous(n, 1);
    for orthog in [Orthog::Cgs, Orthog::Cgs2] {
        for pc in ["none", "jacobi", "block-ilu0"] {
            for side in [PrecondSide::Left, PrecondSide::Right] {
                for max_iter in [16 * 60, 37] {
                    let p = |l| GmresParams {
                        max_iter,
                        arnoldi_loop: l,
                        ..params(orthog, side)
                    };
                    let h = solve_gpu(&be, &SerialComm, &a, &part, pc, &p(ArnoldiLoop::Host));
                    let d = solve_gpu(&be, &SerialComm, &a, &part, pc, &p(ArnoldiLoop::Device));
                    let auto = solve_gpu(&be, &SerialComm, &a, &part, pc, &p(ArnoldiLoop::Auto));
                    let what = format!("{pc} {orthog:?} {side:?} max_iter {max_iter}");
                    println!("{what}: host {}; device {}", its(&h), its(&d));
                    assert_eq!(d.info.arnoldi_loop, ArnoldiLoop::Device, "{what}");
                    assert_eq!(auto.info.arnoldi_loop, ArnoldiLoop::Device, "{what}");
                    assert_eq!(d.info.stop, h.info.stop, "{what}");
                    assert_eq!(d.x_local, h.x_local, "{what}: x");
                    assert_eq!(auto.x_local, h.x_local, "{what}: x (auto)");
                }
            }
        }
    }
    // more basis vectors than one launch takes (MULTI_MAX = 32): the chunked device paths
    for orthog in [Orthog::Cgs, Orthog::Cgs2] {
        let p = |l| GmresParams {
            restart: 40,
            max_iter: 100,
            arnoldi_loop: l,
            ..params(orthog, PrecondSide::Left)
        };
        let h = solve_gpu(&be, &SerialComm, &a, &part, "jacobi", &p(ArnoldiLoop::Host));
        let d = solve_gpu(
            &be,
            &SerialComm,
            &a,
            &part,
            "jacobi",
            &p(ArnoldiLoop::Device),
        );
        println!(
            "restart 40 {orthog:?}: host {} its relres {:.3e}; device {} its",
            h.info.stop.iterations, h.info.stop.relres, d.info.stop.iterations
        );
        assert_eq!(d.info.stop, h.info.stop, "{orthog:?} restart 40");
        assert_eq!(d.x_local, h.x_local, "{orthog:?} restart 40: x");
    }
    // two ranks (threads sharing the GPU; the scalars summed through the host)
    drop(be);
    let p2 = RowPartition::by_nnz(a.indptr(), 2);
    for orthog in [Orthog::Cgs, Orthog::Cgs2] {
        let run = |l| {
            let p = GmresParams {
                arnoldi_loop: l,
                ..params(orthog, PrecondSide::Left)
            };
            on_thread_ranks(2, |c| {
                let be = CudaBackend::new(0).unwrap();
                solve_gpu(&be, c, &a, &p2, "jacobi", &p)
            })
        };
        let (h, d) = (run(ArnoldiLoop::Host), run(ArnoldiLoop::Device));
        for (sh, sd) in h.iter().zip(&d) {
            assert_eq!(sd.info.stop, sh.info.stop, "{orthog:?} 2 ranks");
            assert_eq!(sd.x_local, sh.x_local, "{orthog:?} 2 ranks: x");
        }
    }
}
