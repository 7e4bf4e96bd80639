//! LSQR options beyond the plain solve: the var estimate (against SciPy's), x0 (damping applies
//! to x - x0), column scaling, damping (against the known LSTP solution), istop 0 and 7, and
//! istop on right-hand sides whose norms or estimates underflow (issue 35).

mod common;

use common::{cpu_lsqr, reference_json, reference_vector as read_gz, rel};
use seistomo::backend::cpu::{CpuBackend, CpuCsrOperator};
use seistomo::backend::TransposeStrategy;
use seistomo::comm::SerialComm;
use seistomo::pipeline::options::SolveOptions;
use seistomo::pipeline::solve::solve_system;
use seistomo::solver::{lsqr, LeastSquares, LsqrParams, NoMonitor};
use seistomo::testproblems::Lstp;

fn well(name: &str) -> seistomo::sparse::System {
    common::system(name)
}

fn opts(params: LsqrParams, col_scale: bool) -> SolveOptions {
    SolveOptions {
        col_scale,
        ..common::cpu_opts(params, TransposeStrategy::Csc)
    }
}

/// var against SciPy's. var sums dk^2 over the iterations, and like the iterates it amplifies
/// rounding once Ritz values converge (SciPy's own var on well1033 moves by 0.5 % under a 1e-16
/// perturbation of A^T u): compared tightly after 10 iterations and loosely at convergence.
#[test]
fn var_matches_scipy() {
    let refj = reference_json("lsqr_scipy.json");
    for name in ["well1033", "well1850", "australia"] {
        let sys = common::system(name);
        let early = LsqrParams {
            atol: 1e-10,
            btol: 1e-10,
            conlim: 1e14,
            calc_var: true,
            iter_lim: Some(10),
            ..Default::default()
        };
        let o = solve_system(sys.clone(), &opts(early, false), &SerialComm, 0.0, 0).unwrap();
        let d = rel(
            o.solution.var.as_ref().expect("var requested"),
            &read_gz(&format!("var10_{name}.txt.gz")),
        );
        assert!(
            d <= 1e-10,
            "{name}: var after 10 iterations differs from SciPy's by {d:e}"
        );
        let itn = refj["systems"][name]["itn"].as_u64().unwrap() as usize;
        let full = LsqrParams {
            atol: 1e-10,
            btol: 1e-10,
            conlim: 1e14,
            calc_var: true,
            iter_lim: Some(itn),
            ..Default::default()
        };
        let o = solve_system(sys, &opts(full, false), &SerialComm, 0.0, 0).unwrap();
        let var = o.solution.var.expect("var requested");
        let d = rel(&var, &read_gz(&format!("var_{name}.txt.gz")));
        assert!(
            d <= 2e-2,
            "{name}: converged var differs from SciPy's by {d:e}"
        );
        assert!(var.iter().all(|v| *v >= 0.0));
    }
}

#[test]
fn column_scaling_gives_the_same_least_squares_solution() {
    let sys = well("well1850");
    let params = LsqrParams {
        atol: 1e-12,
        btol: 1e-12,
        conlim: 1e14,
        ..Default::default()
    };
    let o = solve_system(sys, &opts(params, true), &SerialComm, 0.0, 0).unwrap();
    let d = rel(&o.solution.x, &read_gz("x_well1850.txt.gz"));
    assert!(
        d <= 1e-8,
        "scaled solve differs from SciPy's unscaled solution by {d:e}"
    );
    assert!(o.report.col_scale);
}

#[test]
fn damping_applies_to_x_minus_x0() {
    // min ||A x - b||^2 + damp^2 ||x - x0||^2  <=>  x = x0 + argmin ||A d - (b - A x0)||^2 + damp^2 ||d||^2
    let damp = 0.05;
    let p = Lstp::new(400, 300, 4, 2, damp);
    let x0: Vec<f64> = (0..300).map(|j| (j as f64 * 0.37).sin() * 50.0).collect();
    let ax0 = p.apply_dense(&x0);
    let b2: Vec<f64> = p.b.iter().zip(&ax0).map(|(b, a)| b - a).collect();
    let want: Vec<f64> = p
        .exact_solution(&b2)
        .iter()
        .zip(&x0)
        .map(|(d, x)| d + x)
        .collect();
    let params = LsqrParams {
        damp,
        atol: 1e-14,
        btol: 1e-14,
        conlim: 1e15,
        ..Default::default()
    };
    let sol = cpu_lsqr(&p, &p.b, Some(&x0), &params);
    let d = rel(&sol.x, &want);
    assert!(
        d <= 1e-9,
        "x0 run differs from x0 + damped correction by {d:e}"
    );
    // Without x0 the damped solution is a different one.
    let plain = cpu_lsqr(&p, &p.b, None, &params);
    assert!(rel(&plain.x, &want) > 1e-6);
    assert!(rel(&plain.x, &p.exact_solution(&p.b)) <= 1e-9);
}

#[test]
fn zero_rhs_and_iteration_limit() {
    let sys = well("well1033");
    let be = CpuBackend::new();
    let op = CpuCsrOperator::new(sys.a.clone(), TransposeStrategy::Csc);
    let zero = vec![0.0; sys.a.nrows()];
    let s = cpu_lsqr(&op, &zero, None, &LsqrParams::default());
    assert_eq!((s.info.istop, s.info.itn), (0, 0));
    assert!(s.x.iter().all(|v| *v == 0.0));
    let params = LsqrParams {
        atol: 1e-14,
        btol: 1e-14,
        iter_lim: Some(7),
        ..Default::default()
    };
    let s = cpu_lsqr(&op, &sys.b, None, &params);
    assert_eq!((s.info.istop, s.info.itn), (7, 7));
    assert!(s.info.stop_reason.contains("iteration limit"));
    let bad = LsqrParams {
        atol: -1.0,
        ..Default::default()
    };
    assert!(lsqr(
        &LeastSquares::new(&be, &op, &SerialComm, &sys.b),
        &bad,
        &mut NoMonitor
    )
    .is_err());
    assert!(lsqr(
        &LeastSquares::new(&be, &op, &SerialComm, &sys.b[..10]),
        &LsqrParams::default(),
        &mut NoMonitor
    )
    .is_err());
}

/// Reordering rows (and, on a grid, numbering the cells in Morton order) returns the same
/// solution and var in the original order, with the same stopping rule firing.
#[test]
fn reordered_systems_give_the_same_solution() {
    use seistomo::grid::reorder::Reorder;
    let params = LsqrParams {
        atol: 1e-10,
        btol: 1e-10,
        conlim: 1e14,
        calc_var: true,
        damp: 0.01,
        ..Default::default()
    };
    // a straight-ray system on a 16 x 12 x 10 grid, and australia (no grid)
    let g = [16usize, 12, 10];
    let a = seistomo::grid::synthetic::peer_system(g[0], g[1], g[2], 3000, 5, false);
    let xt: Vec<f64> = (0..a.ncols())
        .map(|j| 1.0 + (j as f64 * 0.37).sin())
        .collect();
    let b = a.matvec(&xt);
    let rays = seistomo::sparse::System {
        kernel_rows: 3000,
        a,
        b,
    };
    for (name, sys, grid) in [
        ("rays", rays, Some(g)),
        ("australia", common::system("australia"), None),
    ] {
        for (how, scale) in [
            (Reorder::Rows, false),
            (Reorder::Auto, false),
            (Reorder::Auto, true),
        ] {
            // column scaling changes the damped problem: compare like with like
            let base = solve_system(
                sys.clone(),
                &opts(params.clone(), scale),
                &SerialComm,
                0.0,
                0,
            )
            .unwrap();
            assert_eq!(base.report.reorder, "none");
            let mut o = opts(params.clone(), scale);
            o.reorder = how;
            o.grid = grid;
            let r = solve_system(sys.clone(), &o, &SerialComm, 0.0, 0).unwrap();
            let d = rel(&r.solution.x, &base.solution.x);
            let dv = rel(
                r.solution.var.as_ref().unwrap(),
                base.solution.var.as_ref().unwrap(),
            );
            eprintln!(
                "{name} {how:?} scale {scale}: {} ({} vs {} its), x rel diff {d:e}, var {dv:e}",
                r.report.reorder, r.solution.info.itn, base.solution.info.itn
            );
            assert_eq!(
                r.solution.info.istop, base.solution.info.istop,
                "{name} {how:?}"
            );
            assert!(d <= 1e-8, "{name} {how:?}: x differs by {d:e}");
            assert!(dv <= 1e-2, "{name} {how:?}: var differs by {dv:e}");
            let want = match (how, grid) {
                (Reorder::Auto, Some(_)) => "Morton",
                _ => "rows sorted",
            };
            assert!(r.report.reorder.contains(want), "{}", r.report.reorder);
        }
    }
}

/// LSQR: a right-hand side whose squares underflow (entries of 1e-170: ||b||^2 = 0 in a plain
/// sum) used to stop at once with istop 0, "x = 0 is the exact solution", and one whose
/// estimates underflow (||r||^2, or ||A|| ||r|| below eps in test2) with istop 1 or 2 after
/// one iteration; now it is solved as the unscaled system is (same istop and iterations, x
/// scaled alike).
#[test]
fn lsqr_tiny_rhs_is_solved_not_declared_exact() {
    let sys = common::system("well1033");
    let op = CpuCsrOperator::new(sys.a.clone(), TransposeStrategy::Csc);
    let p = LsqrParams {
        atol: 1e-10,
        btol: 1e-10,
        conlim: 1e14,
        ..Default::default()
    };
    let want = cpu_lsqr(&op, &sys.b, None, &p);
    // powers of two: the scaled system's iterates are the unscaled ones times s, bit for bit,
    // as long as nothing underflows
    for s in [2f64.powi(-560), 2f64.powi(-830)] {
        let b: Vec<f64> = sys.b.iter().map(|v| v * s).collect();
        let got = cpu_lsqr(&op, &b, None, &p);
        eprintln!(
            "b x {s:e}: istop {} after {} (unscaled: {} after {})",
            got.info.istop, got.info.itn, want.info.istop, want.info.itn
        );
        assert_ne!(got.info.istop, 0, "b x {s:e}: {:?}", got.info);
        assert_eq!(got.info.istop, want.info.istop, "b x {s:e}");
        assert_eq!(got.info.itn, want.info.itn, "b x {s:e}");
        let x: Vec<f64> = got.x.iter().map(|v| v / s).collect();
        assert!(rel(&x, &want.x) < 1e-6, "b x {s:e}: {:e}", rel(&x, &want.x));
    }
    // b = 0 still stops at once, and says that the start is the solution
    let z = cpu_lsqr(&op, &vec![0.0; sys.b.len()], None, &p);
    assert_eq!((z.info.istop, z.info.itn), (0, 0));
    assert!(z.info.stop_reason.contains("already a solution"));
}

/// LSQR: entries so large that the solve's norms overflow end in an error, never in a
/// verdict; iter_lim = 0 is the iteration limit (istop 7, x = x0), not "x = 0 is exact".
#[test]
fn lsqr_huge_rhs_and_no_iterations() {
    let sys = common::system("well1033");
    let be = CpuBackend::new();
    let op = CpuCsrOperator::new(sys.a.clone(), TransposeStrategy::Csc);
    let b: Vec<f64> = sys.b.iter().map(|v| v * 1e300).collect();
    let r = lsqr(
        &LeastSquares::new(&be, &op, &SerialComm, &b),
        &LsqrParams::default(),
        &mut NoMonitor,
    );
    match r {
        Err(e) => assert!(e.to_string().contains("not finite"), "{e}"),
        Ok(s) => {
            let x: Vec<f64> = s.x.iter().map(|v| v / 1e300).collect();
            let want = cpu_lsqr(&op, &sys.b, None, &LsqrParams::default());
            assert_eq!(s.info.istop, want.info.istop);
            assert!(rel(&x, &want.x) < 1e-6);
        }
    }
    let p = LsqrParams {
        iter_lim: Some(0),
        ..Default::default()
    };
    let s = cpu_lsqr(&op, &sys.b, None, &p);
    assert_eq!((s.info.istop, s.info.itn), (7, 0), "{:?}", s.info);
    assert!(s.info.stop_reason.contains("iteration limit"));
    assert!(s.x.iter().all(|v| *v == 0.0));
    let x0 = vec![0.5; sys.a.ncols()];
    let s = cpu_lsqr(&op, &sys.b, Some(&x0), &p);
    assert_eq!((s.info.istop, s.info.itn), (7, 0));
    assert_eq!(s.x, x0);
}
