//! GMRES against SciPy's gmres (tests/reference/gmres_scipy.json, written by
//! tests/reference/gmres_reference.py), distributed GMRES on simulated ranks against one rank,
//! preconditioners, breakdowns and the CLI.

mod common;

use common::{
    agreed, iterations_within, on_thread_ranks, read_json, rel as rel_diff, root,
    run_seistomo as run_cli, stderr, GMRES_JACOBI_CLI,
};
use std::path::Path;

use seistomo::backend::cpu::square::DistSquareOperator;
use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::precond::{
    BlockIlu0, Identity, Jacobi, PivotPolicy, Preconditioner, TriSolve,
};
use seistomo::comm::halo::comm_volume;
use seistomo::comm::{Comm, SerialComm};
use seistomo::io::mtx;
use seistomo::partition::graph::RowPartition;
use seistomo::pipeline::operators::{Engine, SquareSystem};
use seistomo::pipeline::options::OperatorSpec;
use seistomo::pipeline::square::gmres_square;
use seistomo::solver::dist_square::SquarePrecond;
use seistomo::solver::gmres::{
    gmres, ArnoldiLoop, ConvergenceTest, GmresHistory, GmresMonitor, GmresParams, GmresSolution,
    NoGmresMonitor, Orthog, PrecondSide,
};
use seistomo::sparse::Csr;
use seistomo::testproblems::square::{cube, SquareKind};

fn scipy_params(orthog: Orthog) -> GmresParams {
    GmresParams {
        restart: 16,
        rtol: 1e-10,
        atol: 0.0,
        max_iter: 16 * 300,
        max_cycles: Some(300),
        orthog,
        side: PrecondSide::Left,
        test: ConvergenceTest::Scipy,
        arnoldi_loop: Default::default(),
    }
}

fn solve_serial(a: &Csr, precond: &str, params: &GmresParams) -> GmresSolution {
    let be = CpuBackend::new();
    let comm = SerialComm;
    let op = DistSquareOperator::serial(a.clone(), &comm).unwrap();
    let b = vec![1.0; a.nrows()];
    let mut pc: Box<dyn Preconditioner<CpuBackend>> = match precond {
        "jacobi" => Box::new(Jacobi::new(&be, &op.diagonal()).unwrap()),
        "none" => Box::new(Identity),
        "block-ilu0" => Box::new(
            BlockIlu0::new(
                op.local_matrix(),
                a.nrows(),
                0,
                PivotPolicy::Error,
                TriSolve::Exact,
            )
            .unwrap(),
        ),
        _ => unreachable!(),
    };
    gmres(
        &be,
        &op,
        pc.as_mut(),
        &comm,
        &b,
        None,
        params,
        &mut NoGmresMonitor,
    )
    .unwrap()
}

fn within_2pct(got: usize, want: usize) -> bool {
    let tol = (0.02 * want as f64).ceil() as usize;
    got.abs_diff(want) <= tol
}

#[test]
fn matches_scipy_verdict_and_iterations() {
    let text = std::fs::read_to_string(root().join("tests/reference/gmres_scipy.json")).unwrap();
    let refj: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = refj["cases"].as_array().unwrap();
    assert!(cases.len() >= 6, "reference has {} cases", cases.len());
    let mut names = std::collections::BTreeSet::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        names.insert(name.to_string());
        let file = root().join(c["file"].as_str().unwrap());
        let pc = c["precond"].as_str().unwrap();
        let a = mtx::read_matrix(&file).unwrap();
        let want_conv = c["scipy"]["converged"].as_bool().unwrap();
        let want_its = c["scipy"]["iterations"].as_u64().unwrap() as usize;
        let mgs = solve_serial(&a, pc, &scipy_params(Orthog::Mgs)).info;
        let cgs = solve_serial(&a, pc, &scipy_params(Orthog::Cgs2)).info;
        let cgs1 = solve_serial(&a, pc, &scipy_params(Orthog::Cgs)).info;
        let dcgs2 = solve_serial(&a, pc, &scipy_params(Orthog::Dcgs2)).info;
        // iteration counts within 2 %
        let close = |got: usize, want: usize, what: &str| {
            assert!(
                within_2pct(got, want),
                "{name} {pc}: {what}: {got} vs {want} iterations"
            );
        };
        assert_eq!(cgs1.stop.converged, want_conv, "{name} {pc}: verdict (cgs)");
        assert_eq!(
            dcgs2.stop.converged, want_conv,
            "{name} {pc}: verdict (dcgs2)"
        );
        close(dcgs2.stop.iterations, want_its, "dcgs2 vs scipy");
        assert!(
            !want_conv || dcgs2.stop.relres <= 1e-10,
            "{name}: {dcgs2:?}"
        );
        close(cgs1.stop.iterations, mgs.stop.iterations, "cgs vs mgs");
        eprintln!(
            "{name} {pc}: scipy {want_its} its conv {want_conv}; mgs {} its conv {} relres {:.3e}; cgs2 {} its conv {}",
            mgs.stop.iterations, mgs.stop.converged, mgs.stop.relres, cgs.stop.iterations, cgs.stop.converged
        );
        assert_eq!(mgs.stop.converged, want_conv, "{name} {pc}: verdict (mgs)");
        assert_eq!(cgs.stop.converged, want_conv, "{name} {pc}: verdict (cgs2)");
        close(mgs.stop.iterations, want_its, "mgs vs scipy");
        close(cgs.stop.iterations, mgs.stop.iterations, "cgs2 vs mgs");
        if want_conv {
            assert!(
                mgs.stop.relres <= 1e-10 && cgs.stop.relres <= 1e-10,
                "{name}: {mgs:?}"
            );
        } else {
            assert!(mgs.stop.relres > 1e-10 && mgs.stop.relres.is_finite());
            assert!(mgs.stop.reason.contains("limit"), "{}", mgs.stop.reason);
        }
    }
    for must in ["convdiff16", "poisson16", "west0479", "nnc1374", "bayer10"] {
        assert!(names.contains(must), "reference lacks {must}");
    }
}

#[test]
fn committed_generated_systems_are_the_generator_output() {
    for (kind, n, file) in [
        (SquareKind::Convdiff, 16, "convdiff16"),
        (SquareKind::Convdiff, 24, "convdiff24"),
        (SquareKind::Poisson, 16, "poisson16"),
    ] {
        let p = root().join(format!("datasets/square_gen/{file}.mtx.gz"));
        let a = mtx::read_matrix(&p).unwrap();
        assert_eq!(a, cube(kind, n).unwrap(), "{}", p.display());
    }
}

#[test]
fn block_ilu0_on_the_suitesparse_systems() {
    // What block-Jacobi ILU(0) (one block: one rank) does on the three hard systems: with the
    // default pivot policy it must either factorise or stop with an error naming a row; with
    // the shift policy it must run to a verdict with a finite residual.
    for name in ["west0479", "nnc1374", "bayer10"] {
        let a = mtx::read_matrix(root().join(format!("datasets/square/{name}.mtx.gz"))).unwrap();
        let n = a.nrows();
        match BlockIlu0::new(&a, n, 0, PivotPolicy::Error, TriSolve::Exact) {
            Ok(_) => eprintln!("{name}: ILU(0) factorises without pivot trouble"),
            Err(e) => {
                let s = e.to_string();
                assert!(s.contains("row "), "{s}");
                eprintln!("{name}: {s}");
            }
        }
        let mut p = BlockIlu0::new(&a, n, 0, PivotPolicy::Shift, TriSolve::Exact).unwrap();
        let be = CpuBackend::new();
        let comm = SerialComm;
        let op = DistSquareOperator::serial(a.clone(), &comm).unwrap();
        let params = GmresParams {
            test: ConvergenceTest::Preconditioned,
            ..scipy_params(Orthog::Mgs)
        };
        let s = gmres(
            &be,
            &op,
            &mut p,
            &comm,
            &vec![1.0; n],
            None,
            &params,
            &mut NoGmresMonitor,
        )
        .unwrap();
        eprintln!(
            "{name}: block-ilu0 (shift: {} inserted, {} replaced): converged {} after {} its, relres {:.3e}, precond relres {:.3e}: {}",
            p.inserted_diagonals, p.replaced_pivots, s.info.stop.converged, s.info.stop.iterations, s.info.stop.relres, s.info.stop.precond_relres, s.info.stop.reason
        );
        assert!(s.info.stop.relres.is_finite() && s.x.iter().all(|v| v.is_finite()));
    }
}

/// Run GMRES on P threads, each rank with its rows of `a`; returns the gathered x and the info
/// of rank 0 (all ranks must agree on the iterations).
fn solve_threads(
    a: &Csr,
    part: &RowPartition,
    precond: &str,
    params: &GmresParams,
) -> (Vec<f64>, usize, bool) {
    let out = on_thread_ranks(part.parts(), |c| {
        let rows: Vec<usize> = part.range(c.rank()).collect();
        let nl = rows.len();
        let pc = match precond {
            "jacobi" => SquarePrecond::Jacobi,
            "block-ilu0" => SquarePrecond::BlockIlu0 {
                pivot: PivotPolicy::Error,
                tri: TriSolve::Exact,
            },
            _ => SquarePrecond::None,
        };
        let sol = gmres_square(
            &Engine::cpu_on_calling_thread(),
            c,
            SquareSystem {
                rows: &a.select_rows(&rows),
                part,
                b: &vec![1.0; nl],
                x0: None,
            },
            pc,
            &OperatorSpec::default(),
            params,
            &mut NoGmresMonitor,
        )
        .unwrap();
        (
            sol.x_local,
            sol.info.stop.iterations,
            sol.info.stop.converged,
        )
    });
    let its = agreed(out.iter().map(|o| o.1), "iterations");
    let conv = out[0].2;
    (out.into_iter().flat_map(|o| o.0).collect(), its, conv)
}

#[test]
fn distributed_ranks_match_one_rank() {
    let a = cube(SquareKind::Convdiff, 12).unwrap();
    for orthog in [Orthog::Mgs, Orthog::Cgs2, Orthog::Cgs, Orthog::Dcgs2] {
        for side in [PrecondSide::Left, PrecondSide::Right] {
            let params = GmresParams {
                orthog,
                side,
                test: ConvergenceTest::Preconditioned,
                ..scipy_params(orthog)
            };
            let serial = solve_serial(&a, "jacobi", &params);
            assert!(serial.info.stop.converged);
            for p in 1..=4 {
                for part in [
                    RowPartition::contiguous(a.nrows(), p),
                    RowPartition::by_nnz(a.indptr(), p),
                ] {
                    let (x, its, conv) = solve_threads(&a, &part, "jacobi", &params);
                    assert!(conv);
                    assert_eq!(
                        its, serial.info.stop.iterations,
                        "{orthog:?} {side:?} P={p}"
                    );
                    let d = rel_diff(&x, &serial.x);
                    assert!(d <= 1e-10, "{orthog:?} {side:?} P={p}: rel diff {d:e}");
                }
            }
        }
    }
    // block-Jacobi ILU(0): the preconditioner depends on the number of blocks; one block equals
    // the serial ILU(0), more blocks still converge to the same solution.
    let params = GmresParams {
        test: ConvergenceTest::Preconditioned,
        ..scipy_params(Orthog::Cgs2)
    };
    let serial = solve_serial(&a, "block-ilu0", &params);
    let serial_j = solve_serial(&a, "jacobi", &params);
    assert!(serial.info.stop.converged);
    assert!(serial.info.stop.iterations < serial_j.info.stop.iterations);
    for p in 1..=4 {
        let (x, its, conv) = solve_threads(
            &a,
            &RowPartition::contiguous(a.nrows(), p),
            "block-ilu0",
            &params,
        );
        assert!(conv, "P={p}");
        if p == 1 {
            assert_eq!(its, serial.info.stop.iterations);
        }
        assert!(rel_diff(&x, &serial.x) < 1e-8, "P={p}");
    }
}

#[test]
fn communication_volume_by_partition() {
    let a = cube(SquareKind::Convdiff, 16).unwrap();
    for p in [2usize, 4] {
        let vc = comm_volume(&a, &RowPartition::contiguous(a.nrows(), p)).unwrap();
        let vn = comm_volume(&a, &RowPartition::by_nnz(a.indptr(), p)).unwrap();
        eprintln!("P={p}: contiguous {vc:?}\n      nnz {vn:?}");
        // slabs of a 16^3 grid exchange one 16x16 plane per neighbour and direction
        assert_eq!(vc.total_values, 2 * (p - 1) * 256);
        assert_eq!(vc.messages, 2 * (p - 1));
        assert!(vn.max_nnz - vn.min_nnz <= vc.max_nnz - vc.min_nnz + 7);
    }
}

#[test]
fn communication_volume_of_the_real_systems() {
    // Printed with --nocapture for docs/gmres.md; the checks: nnz partitions balance nonzeros at
    // least as well as equal row counts (up to one row), and the volume equals the ghosts.
    for name in ["west0479", "nnc1374", "bayer10"] {
        let a = mtx::read_matrix(root().join(format!("datasets/square/{name}.mtx.gz"))).unwrap();
        let maxrow = (0..a.nrows()).map(|i| a.row(i).0.len()).max().unwrap();
        for p in [2usize, 4] {
            let vc = comm_volume(&a, &RowPartition::contiguous(a.nrows(), p)).unwrap();
            let vn = comm_volume(&a, &RowPartition::by_nnz(a.indptr(), p)).unwrap();
            eprintln!(
                "| {name} | {p} | rows | {} | {} | {} | {} / {} |",
                vc.total_values, vc.max_values, vc.messages, vc.max_nnz, vc.min_nnz
            );
            eprintln!(
                "| {name} | {p} | nnz | {} | {} | {} | {} / {} |",
                vn.total_values, vn.max_values, vn.messages, vn.max_nnz, vn.min_nnz
            );
            assert!(vn.max_nnz <= vc.max_nnz + maxrow);
            assert!(vc.total_values <= a.nrows() * (p - 1));
        }
    }
}

#[test]
fn breakdowns_limits_and_trivial_cases() {
    // Identity (n = 4: v_0 = ones/2 exactly): happy breakdown after one iteration.
    let n = 4;
    let idx: Vec<u64> = (0..n as u64).collect();
    let eye = Csr::from_triplets(n, n, &idx, &idx, &vec![1.0; n]).unwrap();
    let s = solve_serial(&eye, "none", &GmresParams::default());
    assert!(s.info.stop.converged, "{:?}", s.info);
    assert_eq!(s.info.stop.iterations, 1);
    assert!(s.info.stop.reason.contains("breakdown"), "{:?}", s.info);
    assert!(s.x.iter().all(|&v| (v - 1.0).abs() < 1e-15));
    // Singular: a zero matrix breaks down without converging, and says so (no NaN).
    let n = 50;
    let zero = Csr::zeros(n, n);
    let s = solve_serial(&zero, "jacobi", &GmresParams::default());
    assert!(!s.info.stop.converged);
    assert!(
        s.info.stop.reason.contains("breakdown"),
        "{}",
        s.info.stop.reason
    );
    assert!(s.x.iter().all(|v| v.is_finite()));
    // Iteration limit.
    let a = cube(SquareKind::Convdiff, 10).unwrap();
    let p = GmresParams {
        max_iter: 7,
        ..GmresParams::default()
    };
    let s = solve_serial(&a, "jacobi", &p);
    assert!(!s.info.stop.converged);
    assert_eq!(s.info.stop.iterations, 7);
    assert!(s.info.stop.reason.contains("iteration limit"));
    // b = 0
    let be = CpuBackend::new();
    let comm = SerialComm;
    let op = DistSquareOperator::serial(a.clone(), &comm).unwrap();
    // GMRES on `op` with default parameters, b = `b_value` everywhere.
    let run = |pc: &mut dyn Preconditioner<CpuBackend>,
               b_value: f64,
               x0: Option<&[f64]>,
               monitor: &mut dyn GmresMonitor| {
        let b = vec![b_value; a.nrows()];
        gmres(
            &be,
            &op,
            pc,
            &comm,
            &b,
            x0,
            &GmresParams::default(),
            monitor,
        )
        .unwrap()
    };
    let mut hist = GmresHistory::default();
    let x0 = vec![3.0; a.nrows()];
    let s = run(&mut Identity, 0.0, Some(&x0), &mut hist);
    assert!(s.info.stop.converged && s.x.iter().all(|&v| v == 0.0));
    // monitor from iteration 0, one record per iteration
    let mut hist = GmresHistory::default();
    let s = run(&mut Identity, 1.0, None, &mut hist);
    assert_eq!(hist.0[0].iteration, 0);
    assert_eq!(hist.0[0].relres, 1.0);
    assert_eq!(hist.0.len(), s.info.stop.iterations + 1);
    assert!(s.info.stop.converged && s.info.stop.relres <= 1e-10);
    // Right preconditioning and the inexact (Jacobi-sweep) ILU solves reach the same x.
    let right = solve_serial(
        &a,
        "jacobi",
        &GmresParams {
            side: PrecondSide::Right,
            ..GmresParams::default()
        },
    );
    assert!(right.info.stop.converged);
    assert!(rel_diff(&right.x, &s.x) < 1e-8);
    let mut ilu = BlockIlu0::new(
        op.local_matrix(),
        a.nrows(),
        0,
        PivotPolicy::Error,
        TriSolve::Jacobi(3),
    )
    .unwrap();
    let si = run(&mut ilu, 1.0, None, &mut NoGmresMonitor);
    assert!(si.info.stop.converged);
    assert!(rel_diff(&si.x, &s.x) < 1e-8);
}

#[test]
fn cli_square_and_solve_gmres() {
    let d = common::scratch("gmres-cli");
    let m = d.join("cd.mtx");
    let o = run_cli(&[
        "square",
        "--kind",
        "convdiff",
        "--n",
        "8",
        "-o",
        m.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        mtx::read_matrix(&m).unwrap(),
        cube(SquareKind::Convdiff, 8).unwrap()
    );
    let (x, r, h) = (d.join("x.txt"), d.join("r.json"), d.join("h.csv"));
    let mut args = GMRES_JACOBI_CLI.to_vec();
    args.extend(["--matrix", m.to_str().unwrap(), "--orthog", "cgs2"]);
    args.extend(["--backend", "cpu", "--solution", x.to_str().unwrap()]);
    args.extend([
        "--report",
        r.to_str().unwrap(),
        "--history",
        h.to_str().unwrap(),
    ]);
    let o = run_cli(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let rep = read_json(&r);
    assert_eq!(rep["method"], "gmres");
    assert_eq!(rep["converged"], true);
    assert!(rep["relres"].as_f64().unwrap() <= 1e-9);
    let its = rep["iterations"].as_u64().unwrap() as usize;
    let hist = std::fs::read_to_string(&h).unwrap();
    assert_eq!(hist.lines().count(), its + 2); // header + iteration 0..its
    let xs = mtx::read_vector(&x).unwrap();
    let a = cube(SquareKind::Convdiff, 8).unwrap();
    let res: f64 = a
        .matvec(&xs)
        .iter()
        .map(|v| (v - 1.0) * (v - 1.0))
        .sum::<f64>()
        .sqrt();
    assert!(res / (a.nrows() as f64).sqrt() < 1e-8);
    // Non-convergence: plain report, warning, exit status 0.
    let w = root().join("datasets/square/west0479.mtx.gz");
    let west = [
        "solve",
        "--method",
        "gmres",
        "--matrix",
        w.to_str().unwrap(),
    ];
    let o = run_cli(
        &[
            &west[..],
            &["--max-iter", "320", "--report", r.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success());
    let err = stderr(&o);
    assert!(err.contains("did not converge"), "{err}");
    let rep = read_json(&r);
    assert_eq!(rep["converged"], false);
    assert_eq!(rep["iterations"], 320);
    // ILU(0) on a matrix with missing diagonal entries: one clear error line, exit status 1.
    let o = run_cli(&[&west[..], &["--precond", "block-ilu0"]].concat());
    if !o.status.success() {
        let err = stderr(&o);
        assert!(err.contains("diagonal") || err.contains("pivot"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let _ = std::fs::remove_dir_all(&d);
    let _ = Path::new("");
}

/// DCGS2 (one reduction per inner step) against CGS2 on the bundled square systems and the
/// generated ones: the same verdict, iterations equal or one apart, and for converged solves the
/// same solution within what the tolerance allows.
#[test]
fn dcgs2_matches_cgs2() {
    let mut cases: Vec<(String, Csr)> = ["convdiff16", "convdiff24", "poisson16"]
        .iter()
        .map(|n| {
            let f = root().join(format!("datasets/square_gen/{n}.mtx.gz"));
            (n.to_string(), mtx::read_matrix(&f).unwrap())
        })
        .collect();
    for n in ["west0479", "nnc1374", "bayer10"] {
        let f = root().join(format!("datasets/square/{n}.mtx.gz"));
        cases.push((n.to_string(), mtx::read_matrix(&f).unwrap()));
    }
    for (name, a) in &cases {
        for pc in ["none", "jacobi"] {
            for side in [PrecondSide::Left, PrecondSide::Right] {
                let p = |orthog| GmresParams {
                    orthog,
                    side,
                    test: ConvergenceTest::Preconditioned,
                    max_iter: 1000,
                    max_cycles: None,
                    ..scipy_params(orthog)
                };
                let c = solve_serial(a, pc, &p(Orthog::Cgs2));
                let d = solve_serial(a, pc, &p(Orthog::Dcgs2));
                let tag = format!("{name} {pc} {side:?}");
                assert_eq!(
                    c.info.stop.converged, d.info.stop.converged,
                    "{tag}: verdict"
                );
                if c.info.stop.converged {
                    let what = format!("{tag}: cgs2 vs dcgs2");
                    iterations_within(c.info.stop.iterations, d.info.stop.iterations, 1, &what);
                    let diff = rel_diff(&d.x, &c.x);
                    assert!(diff <= 1e-6, "{tag}: rel diff {diff:e}");
                    assert!(d.info.stop.precond_relres <= 1e-10, "{tag}");
                }
            }
        }
    }
}

/// The point of DCGS2: one reduction per inner step (CGS2: three), plus the residual norms of
/// each restart and the two norms of b.
#[test]
fn dcgs2_reduces_once_per_inner_step() {
    let a = mtx::read_matrix(root().join("datasets/square_gen/convdiff16.mtx.gz")).unwrap();
    let be = CpuBackend::new();
    let b = vec![1.0; a.nrows()];
    let count = |orthog| {
        let serial = SerialComm;
        let comm = seistomo::comm::TimedComm::new(&serial);
        let op = DistSquareOperator::serial(a.clone(), &comm).unwrap();
        let mut pc = Jacobi::new(&be, &op.diagonal()).unwrap();
        let params = GmresParams {
            test: ConvergenceTest::Preconditioned,
            ..scipy_params(orthog)
        };
        let sol = gmres(
            &be,
            &op,
            &mut pc,
            &comm,
            &b,
            None,
            &params,
            &mut NoGmresMonitor,
        )
        .unwrap();
        assert!(sol.info.stop.converged);
        let t = comm.totals();
        (sol.info, t.vector_calls + t.scalar_calls)
    };
    let (di, dcalls) = count(Orthog::Dcgs2);
    let (ci, ccalls) = count(Orthog::Cgs2);
    let cycles = di.stop.restarts as u64 + 1;
    eprintln!(
        "dcgs2: {} its, {cycles} cycles, {dcalls} reductions; cgs2: {} its, {ccalls} reductions",
        di.stop.iterations, ci.stop.iterations
    );
    // b, M^-1 b, and ||r||, ||M^-1 r|| once before the first cycle and after each one
    let overhead = 2 + 2 * (cycles + 1);
    assert!(
        dcalls <= di.stop.iterations as u64 + overhead,
        "{dcalls} reductions"
    );
    assert!(ccalls >= 3 * ci.stop.iterations as u64);
}

/// DCGS2's breakdowns: the Pythagorean norm cancels to zero at an invariant subspace, the
/// explicit norm decides, as for the other choices; the same iterations and answer as CGS2.
#[test]
fn dcgs2_breakdowns() {
    let p = GmresParams {
        orthog: Orthog::Dcgs2,
        ..GmresParams::default()
    };
    let n = 4;
    let idx: Vec<u64> = (0..n as u64).collect();
    let eye = Csr::from_triplets(n, n, &idx, &idx, &vec![1.0; n]).unwrap();
    let s = solve_serial(&eye, "none", &p);
    assert!(
        s.info.stop.converged && s.info.stop.iterations == 1,
        "{:?}",
        s.info
    );
    assert!(s.info.stop.reason.contains("breakdown"), "{:?}", s.info);
    let s = solve_serial(&Csr::zeros(50, 50), "jacobi", &p);
    assert!(!s.info.stop.converged && s.info.stop.reason.contains("breakdown"));
    assert!(s.x.iter().all(|v| v.is_finite()));
    // three distinct eigenvalues: the Krylov space is invariant after three steps
    let n = 30;
    let idx: Vec<u64> = (0..n as u64).collect();
    let vals: Vec<f64> = (0..n).map(|i| 1.0 + (i % 3) as f64).collect();
    let d = Csr::from_triplets(n, n, &idx, &idx, &vals).unwrap();
    for orthog in [Orthog::Cgs2, Orthog::Dcgs2] {
        let s = solve_serial(
            &d,
            "none",
            &GmresParams {
                orthog,
                ..p.clone()
            },
        );
        assert!(s.info.stop.converged, "{orthog:?} {:?}", s.info);
        assert_eq!(s.info.stop.iterations, 3, "{orthog:?} {:?}", s.info);
        // CGS2's second pass leaves ~1e-17 (a breakdown); DCGS2's single pass leaves ~1e-15,
        // above the breakdown test, and the residual estimate stops it instead
        if orthog == Orthog::Cgs2 {
            assert!(s.info.stop.reason.contains("breakdown"), "{:?}", s.info);
        }
        for (x, v) in s.x.iter().zip(&vals) {
            assert!((x - 1.0 / v).abs() < 1e-12, "{orthog:?}");
        }
    }
}

/// The device Arnoldi loop (a cycle's scalars kept on the backend, the stopping tests run
/// afterwards on the same numbers) against the host loop: the same iterations, verdicts,
/// residuals, history and x, bit for bit, on the CPU backend (which runs both); with limits
/// that end a run inside a cycle, both stopping rules, both sides, every preconditioner,
/// breakdowns and several ranks.
#[test]
fn device_arnoldi_loop_equals_the_host_loop() {
    let a = cube(SquareKind::Convdiff, 10).unwrap();
    let n4: Vec<u64> = (0..4).collect();
    let eye = Csr::from_triplets(4, 4, &n4, &n4, &[1.0; 4]).unwrap();
    let zero = Csr::zeros(30, 30);
    let base = |orthog, loop_| GmresParams {
        orthog,
        arnoldi_loop: loop_,
        test: ConvergenceTest::Preconditioned,
        ..scipy_params(orthog)
    };
    let mut cases = 0;
    for orthog in [Orthog::Cgs, Orthog::Cgs2] {
        for (name, m) in [("convdiff", &a), ("identity", &eye), ("zero", &zero)] {
            for pc in ["none", "jacobi", "block-ilu0"] {
                if name == "zero" && pc == "block-ilu0" {
                    continue; // no pivots
                }
                for side in [PrecondSide::Left, PrecondSide::Right] {
                    for test in [ConvergenceTest::Preconditioned, ConvergenceTest::Scipy] {
                        if test == ConvergenceTest::Scipy && side == PrecondSide::Right {
                            continue;
                        }
                        // restart 40: a device-loop cycle launched in pieces of 16 steps (the
                        // test firing in a later piece; 50 = 40 + 10: the limit inside one)
                        for (max_iter, restart) in
                            [(4800, 16), (23, 8), (5, 16), (4800, 40), (50, 40)]
                        {
                            let p = |l| GmresParams {
                                side,
                                test,
                                max_iter,
                                restart,
                                ..base(orthog, l)
                            };
                            let run = |l| {
                                let mut hist = GmresHistory::default();
                                let be = CpuBackend::new();
                                let comm = SerialComm;
                                let op = DistSquareOperator::serial(m.clone(), &comm).unwrap();
                                let mut pc: Box<dyn Preconditioner<CpuBackend>> = match pc {
                                    "jacobi" => Box::new(Jacobi::new(&be, &op.diagonal()).unwrap()),
                                    "none" => Box::new(Identity),
                                    _ => Box::new(
                                        BlockIlu0::new(
                                            op.local_matrix(),
                                            m.nrows(),
                                            0,
                                            PivotPolicy::Error,
                                            TriSolve::Exact,
                                        )
                                        .unwrap(),
                                    ),
                                };
                                let b = vec![1.0; m.nrows()];
                                let s =
                                    gmres(&be, &op, pc.as_mut(), &comm, &b, None, &p(l), &mut hist)
                                        .unwrap();
                                (s, hist.0)
                            };
                            let (h, hh) = run(ArnoldiLoop::Host);
                            let (d, hd) = run(ArnoldiLoop::Device);
                            let what = format!("{name} {pc} {orthog:?} {side:?} {test:?} max_iter {max_iter} m {restart}");
                            assert_eq!(h.info.arnoldi_loop, ArnoldiLoop::Host, "{what}");
                            assert_eq!(d.info.arnoldi_loop, ArnoldiLoop::Device, "{what}");
                            assert_eq!(d.info.stop, h.info.stop, "{what}");
                            assert_eq!(d.x, h.x, "{what}: x");
                            assert_eq!(hd.len(), hh.len(), "{what}: history");
                            for (rd, rh) in hd.iter().zip(&hh) {
                                assert_eq!(
                                    (rd.iteration, rd.cycle, rd.resnorm.to_bits()),
                                    (rh.iteration, rh.cycle, rh.resnorm.to_bits()),
                                    "{what}: record"
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 240, "{cases} cases");
    // Several ranks: the scalars are summed over ranks in the loop.
    for orthog in [Orthog::Cgs, Orthog::Cgs2] {
        for (p, restart) in [(2usize, 16), (3, 16), (2, 40)] {
            let part = RowPartition::by_nnz(a.indptr(), p);
            let with = |l| GmresParams {
                restart,
                ..base(orthog, l)
            };
            let (xh, ih, ch) = solve_threads(&a, &part, "jacobi", &with(ArnoldiLoop::Host));
            let (xd, id, cd) = solve_threads(&a, &part, "jacobi", &with(ArnoldiLoop::Device));
            assert!(ch && cd);
            assert_eq!(id, ih, "{orthog:?} P={p} m {restart}");
            assert_eq!(xd, xh, "{orthog:?} P={p} m {restart}");
        }
    }
    // Asked for with an orthogonalisation it does not run: one clear error.
    let e = gmres(
        &CpuBackend::new(),
        &DistSquareOperator::serial(a.clone(), &SerialComm).unwrap(),
        &mut Identity,
        &SerialComm,
        &vec![1.0; a.nrows()],
        None,
        &base(Orthog::Mgs, ArnoldiLoop::Device),
        &mut NoGmresMonitor,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("cgs"), "{e}");
    // Auto on the CPU keeps the host loop (scalars are on the host anyway).
    let s = solve_serial(&a, "jacobi", &base(Orthog::Cgs, ArnoldiLoop::Auto));
    assert_eq!(s.info.arnoldi_loop, ArnoldiLoop::Host);
}

/// Which bundled square systems the GPU stores as row patterns (src/sparse/patterns.rs), and
/// that their host product is the CSR product: the generated stencils qualify with a few dozen
/// patterns; a SuiteSparse matrix with irregular rows does not, and says why.
#[test]
fn row_patterns_of_the_bundled_square_systems() {
    use seistomo::sparse::patterns::{NotPatterned, PatternLimits, RowPatterns};
    use seistomo::sparse::Precision;
    for (f, patterns) in [
        ("datasets/square_gen/convdiff16.mtx.gz", 27),
        ("datasets/square_gen/convdiff24.mtx.gz", 27),
        ("datasets/square_gen/poisson16.mtx.gz", 27),
    ] {
        let a = mtx::read_matrix(root().join(f)).unwrap();
        let p = RowPatterns::from_csr(&a, Precision::F64, PatternLimits::default()).unwrap();
        println!("{f}: {}", p.describe());
        assert_eq!(p.patterns(), patterns, "{f}");
        assert!(
            p.bytes() * 4 < (12 * a.nnz() + 8 * a.nrows()) * 3,
            "{f}: bytes"
        );
        let x: Vec<f64> = (0..a.ncols()).map(|i| (i as f64 * 0.61).cos()).collect();
        let (got, want) = (p.matvec(&x), a.matvec(&x));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-13 * w.abs().max(1.0), "{f}: {g} vs {w}");
        }
    }
    let a = mtx::read_matrix(root().join("datasets/square/bayer10.mtx.gz")).unwrap();
    let e = RowPatterns::from_csr(&a, Precision::F64, PatternLimits::default()).unwrap_err();
    println!("bayer10: {e}");
    assert!(
        matches!(
            e,
            NotPatterned::TooMuchPadding { .. } | NotPatterned::TooManyPatterns { .. }
        ),
        "{e:?}"
    );
}
