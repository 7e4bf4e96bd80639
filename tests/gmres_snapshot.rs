//! Every GMRES option combination (orthogonalisation x Arnoldi loop x side x stopping rule x
//! preconditioner x limits) on small systems, one rank and two, written as bit patterns: the
//! iterations, stop, history and x of each run. For refactoring the solver without changing a
//! bit of what it computes:
//!
//! ```text
//! SEISTOMO_GMRES_SNAPSHOT=record:/tmp/before.txt cargo test --test gmres_snapshot
//! (change the solver)
//! SEISTOMO_GMRES_SNAPSHOT=compare:/tmp/before.txt cargo test --test gmres_snapshot
//! ```
//!
//! Without the variable the test runs every combination and checks only that each one ends in
//! a verdict or a clear error (and that the host and device Arnoldi loops agree bit for bit).

mod common;

use std::collections::BTreeMap;
use std::fmt::Write;

use common::{on_thread_ranks, root};
use seistomo::backend::cpu::square::DistSquareOperator;
use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::precond::{
    BlockIlu0, Identity, Jacobi, PivotPolicy, Preconditioner, TriSolve,
};
use seistomo::comm::{Comm, SerialComm};
use seistomo::io::mtx;
use seistomo::partition::graph::RowPartition;
use seistomo::pipeline::operators::{Engine, SquareSystem};
use seistomo::pipeline::options::OperatorSpec;
use seistomo::pipeline::square::gmres_square;
use seistomo::solver::dist_square::SquarePrecond;
use seistomo::solver::gmres::{
    gmres, ArnoldiLoop, ConvergenceTest, GmresHistory, GmresInfo, GmresParams, GmresRecord, Orthog,
    PrecondSide,
};
use seistomo::sparse::Csr;
use seistomo::testproblems::square::{cube, SquareKind};

/// Rows 0..rows of `a` times `s`.
fn scale_rows(mut a: Csr, rows: usize, s: f64) -> Csr {
    let ptr = a.indptr().to_vec();
    for v in &mut a.data_mut()[ptr[0] as usize..ptr[rows] as usize] {
        *v *= s;
    }
    a
}

fn diag(vals: &[f64]) -> Csr {
    let idx: Vec<u64> = (0..vals.len() as u64).collect();
    Csr::from_triplets(vals.len(), vals.len(), &idx, &idx, vals).unwrap()
}

/// The systems: well-conditioned stencils, a hard SuiteSparse matrix, breakdowns, and the
/// badly scaled cases of issue 35.
fn systems() -> Vec<(&'static str, Csr, Vec<f64>)> {
    let ones = |a: &Csr| vec![1.0; a.nrows()];
    let mut out = Vec::new();
    let cd = cube(SquareKind::Convdiff, 8).unwrap();
    out.push(("convdiff8", cd.clone(), ones(&cd)));
    let p = cube(SquareKind::Poisson, 6).unwrap();
    out.push(("poisson6", p.clone(), ones(&p)));
    let w = mtx::read_matrix(root().join("datasets/square/west0479.mtx.gz")).unwrap();
    out.push(("west0479", w.clone(), ones(&w)));
    out.push(("identity4", diag(&[1.0; 4]), vec![1.0; 4]));
    out.push(("zero30", Csr::zeros(30, 30), vec![1.0; 30]));
    let d: Vec<f64> = (0..30).map(|i| 1.0 + (i % 3) as f64).collect();
    out.push(("diag3", diag(&d), vec![1.0; 30]));
    let sc = scale_rows(cd.clone(), 100, 1e8);
    out.push(("convdiff8-rows1e8", sc.clone(), ones(&sc)));
    let bd = Csr::from_triplets(
        3,
        3,
        &[0, 0, 1, 1, 2],
        &[0, 1, 1, 2, 2],
        &[1e160, 1e160, 1e160, 1e160, 1e160],
    )
    .unwrap();
    out.push(("bidiag1e160", bd, vec![1.0; 3]));
    out
}

/// An f64 as its bit pattern.
fn bits(v: f64) -> String {
    format!("{:016x}", v.to_bits())
}

/// A run's numbers as text: the stop (every field but timings), the history, x.
fn digest(info: &GmresInfo, hist: &[GmresRecord], x: &[f64]) -> String {
    let st = &info.stop;
    let mut s = format!(
        "stop {} its {} restarts {} loop {:?} reason {}\n",
        st.converged, st.iterations, st.restarts, info.arnoldi_loop, st.reason
    );
    let (r, p, b) = (bits(st.relres), bits(st.precond_relres), bits(info.bnorm));
    write!(s, "relres {r} precond_relres {p} bnorm {b}\nhist").unwrap();
    for r in hist {
        let (n, q) = (bits(r.resnorm), bits(r.relres));
        write!(s, " {}/{}/{n}/{q}", r.iteration, r.cycle).unwrap();
    }
    s.push_str("\nx");
    for v in x {
        write!(s, " {}", bits(*v)).unwrap();
    }
    s.push('\n');
    s
}

fn precond(
    be: &CpuBackend,
    op: &DistSquareOperator,
    a: &Csr,
    name: &str,
) -> Option<Box<dyn Preconditioner<CpuBackend>>> {
    Some(match name {
        "none" => Box::new(Identity),
        "jacobi" => Box::new(Jacobi::new(be, &op.diagonal()).unwrap()),
        _ => Box::new(
            BlockIlu0::new(
                op.local_matrix(),
                a.nrows(),
                0,
                PivotPolicy::Shift,
                TriSolve::Exact,
            )
            .ok()?,
        ),
    })
}

fn combos() -> Vec<(Orthog, ArnoldiLoop, PrecondSide, ConvergenceTest)> {
    let mut out = Vec::new();
    for (orthog, lp) in [
        (Orthog::Mgs, ArnoldiLoop::Host),
        (Orthog::Cgs, ArnoldiLoop::Host),
        (Orthog::Cgs, ArnoldiLoop::Device),
        (Orthog::Cgs2, ArnoldiLoop::Host),
        (Orthog::Cgs2, ArnoldiLoop::Device),
        (Orthog::Dcgs2, ArnoldiLoop::Host),
    ] {
        for (side, test) in [
            (PrecondSide::Left, ConvergenceTest::Preconditioned),
            (PrecondSide::Right, ConvergenceTest::Preconditioned),
            (PrecondSide::Left, ConvergenceTest::Scipy),
        ] {
            out.push((orthog, lp, side, test));
        }
    }
    out
}

/// Every run's digest by its name.
fn run_all() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let be = CpuBackend::new();
    let comm = SerialComm;
    for (name, a, b) in systems() {
        let op = DistSquareOperator::serial(a.clone(), &comm).unwrap();
        for pcname in ["none", "jacobi", "block-ilu0"] {
            for (max_iter, restart, max_cycles) in
                [(400, 16, None), (23, 8, None), (400, 5, Some(3))]
            {
                for (orthog, lp, side, test) in combos() {
                    let params = GmresParams {
                        restart,
                        rtol: 1e-10,
                        atol: 0.0,
                        max_iter,
                        max_cycles,
                        orthog,
                        side,
                        test,
                        arnoldi_loop: lp,
                    };
                    let key = format!(
                        "{name} {pcname} max_iter {max_iter} m {restart} cycles {max_cycles:?} {orthog:?} {lp:?} {side:?} {test:?}"
                    );
                    let Some(mut pc) = precond(&be, &op, &a, pcname) else {
                        out.insert(key, "no preconditioner\n".into());
                        continue;
                    };
                    let mut hist = GmresHistory::default();
                    let d = match gmres(&be, &op, pc.as_mut(), &comm, &b, None, &params, &mut hist)
                    {
                        Ok(s) => digest(&s.info, &hist.0, &s.x),
                        Err(e) => format!("error {e}\n"),
                    };
                    out.insert(key, d);
                }
            }
        }
    }
    // Two and three ranks (the reductions over a ThreadComm).
    let a = cube(SquareKind::Convdiff, 8).unwrap();
    for p in [2usize, 3] {
        let part = RowPartition::by_nnz(a.indptr(), p);
        for (orthog, lp, side, test) in combos() {
            let params = GmresParams {
                restart: 8,
                rtol: 1e-10,
                atol: 0.0,
                max_iter: 400,
                max_cycles: None,
                orthog,
                side,
                test,
                arnoldi_loop: lp,
            };
            let per_rank = on_thread_ranks(p, |c| {
                let rows: Vec<usize> = part.range(c.rank()).collect();
                let mut hist = GmresHistory::default();
                let s = gmres_square(
                    &Engine::cpu_on_calling_thread(),
                    c,
                    SquareSystem {
                        rows: &a.select_rows(&rows),
                        part: &part,
                        b: &vec![1.0; rows.len()],
                        x0: None,
                    },
                    SquarePrecond::Jacobi,
                    &OperatorSpec::default(),
                    &params,
                    &mut hist,
                )
                .unwrap();
                digest(&s.info, &hist.0, &s.x_local)
            });
            let key = format!("convdiff8 P={p} jacobi {orthog:?} {lp:?} {side:?} {test:?}");
            out.insert(key, per_rank.concat());
        }
    }
    out
}

fn write_snapshot(runs: &BTreeMap<String, String>) -> String {
    let mut s = String::new();
    for (k, v) in runs {
        writeln!(s, "== {k}").unwrap();
        s.push_str(v);
    }
    s
}

fn read_snapshot(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut key: Option<String> = None;
    let mut val = String::new();
    for line in text.lines() {
        if let Some(k) = line.strip_prefix("== ") {
            if let Some(k0) = key.replace(k.to_string()) {
                out.insert(k0, std::mem::take(&mut val));
            }
        } else {
            val.push_str(line);
            val.push('\n');
        }
    }
    if let Some(k) = key {
        out.insert(k, val);
    }
    out
}

#[test]
fn every_option_combination_bitwise() {
    let runs = run_all();
    eprintln!("{} runs", runs.len());
    // host and device Arnoldi loops agree bit for bit wherever both run
    for (k, v) in &runs {
        if k.contains(" Device ") {
            let h = runs[&k.replace(" Device ", " Host ")].replace("loop Host", "loop Device");
            assert_eq!(v, &h, "{k}: device vs host loop");
        }
        assert!(v.starts_with("stop ") || v.starts_with("error ") || v.starts_with("no "));
    }
    match std::env::var("SEISTOMO_GMRES_SNAPSHOT") {
        Ok(spec) if spec.starts_with("record:") => {
            std::fs::write(&spec[7..], write_snapshot(&runs)).unwrap();
            eprintln!("recorded {} runs in {}", runs.len(), &spec[7..]);
        }
        Ok(spec) if spec.starts_with("compare:") => {
            let want = read_snapshot(&std::fs::read_to_string(&spec[8..]).unwrap());
            assert_eq!(want.len(), runs.len(), "number of runs");
            let mut differ = Vec::new();
            for (k, v) in &runs {
                if want.get(k) != Some(v) {
                    differ.push(k.clone());
                }
            }
            for k in differ.iter().take(5) {
                eprintln!(
                    "== {k}\nwant: {}\ngot:  {}",
                    want.get(k).map_or("(none)", |s| &s[..s.len().min(400)]),
                    &runs[k][..runs[k].len().min(400)]
                );
            }
            assert!(
                differ.is_empty(),
                "{} of {} runs differ",
                differ.len(),
                runs.len()
            );
            eprintln!("all {} runs identical to {}", runs.len(), &spec[8..]);
        }
        _ => {}
    }
}
