//! CUDA backend against the CPU backend (the reference). The tests that need a GPU are
//! `#[ignore]`d, so that a machine without one counts them as ignored, not passed; on the GPU
//! machine they run with `--include-ignored` (bench/gpu.sh tests), and fail there if no usable
//! GPU is found. The CPU-only tests (summation orders, the backend choice) always run.

mod common;

use common::gpu::{down, gpu, products, rand_vec, real_systems, rel};
use common::seistomo_path as seistomo_bin;

use seistomo::backend::cpu::{CpuBackend, CpuCsrOperator};
use seistomo::backend::cuda::{probe, segments, CudaCsrOperator};
use seistomo::backend::storage::DeviceCsr;
use seistomo::backend::{Backend, Operator, Precision, Scale, TransposeStrategy, XwState, XwStep};
use seistomo::comm::SerialComm;
use seistomo::grid::Rng;
use seistomo::pipeline::operators::choose_backend;
use seistomo::pipeline::options::BackendChoice;
use seistomo::solver::{LeastSquares, LsqrParams, NoMonitor};
use seistomo::sparse::Csr;
use seistomo::testproblems::awkward_csr;

/// The matrix with values rounded to f32 (what the GPU stores with f32 precision).
fn rounded(a: &Csr) -> Csr {
    let mut r = a.clone();
    r.data_mut().iter_mut().for_each(|v| *v = *v as f32 as f64);
    r
}

const SHAPES: [(usize, usize); 5] = [(2000, 700), (300, 9000), (50_000, 64), (7, 3), (8000, 2000)];
const STRATEGIES: [TransposeStrategy; 3] = [
    TransposeStrategy::Csc,
    TransposeStrategy::Scatter,
    TransposeStrategy::Library,
];

#[test]
fn choose_backend_reports_why() {
    match probe() {
        Err(why) => {
            let e = choose_backend(BackendChoice::Cuda).unwrap_err().to_string();
            assert!(e.contains("no usable CUDA GPU"), "{e}");
            let (k, msg) = choose_backend(BackendChoice::Auto).unwrap();
            assert_eq!(k, BackendChoice::Cpu);
            assert!(msg.contains("no usable CUDA GPU"), "{msg}");
            println!("skipped GPU half: no CUDA GPU ({why})");
        }
        Ok(_) => {
            let (k, msg) = choose_backend(BackendChoice::Auto).unwrap();
            assert_eq!(k, BackendChoice::Cuda, "{msg}");
            assert!(choose_backend(BackendChoice::Cuda).is_ok());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn staged_uploads_arrive_whole() {
    // Several staging pieces, a partial last one, and arrays of 8, 4 and 2-byte elements.
    let g = gpu();
    fn round_trip<T: cudarc::driver::DeviceRepr + Copy + Default + PartialEq + std::fmt::Debug>(
        g: &seistomo::backend::cuda::CudaBackend,
        v: &[T],
    ) {
        let d = g.upload_staged(v).unwrap();
        assert!(
            g.stream().clone_dtoh(&d).unwrap() == v,
            "{} elements",
            v.len()
        );
    }
    let stage = seistomo::backend::cuda::STAGE;
    for n in [1, 1000, stage / 8, 3 * stage / 8 + 13, 5 * stage / 8 + 1] {
        round_trip(&g, &rand_vec(n, n as u64));
        let u: Vec<u32> = (0..2 * n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        round_trip(&g, &u);
        let h: Vec<u16> = (0..4 * n as u32 + 3).map(|i| (i * 7919) as u16).collect();
        round_trip(&g, &h);
    }
}

/// NCCL over two GPUs from two thread ranks of one process, three backends one after another:
/// every sum is right, and only the first makes communicators; the next backends take the ones
/// the backend before left (kept for the process's next run instead of aborted). On a machine
/// with one GPU it says so and returns.
#[test]
#[ignore = "needs two CUDA GPUs and libnccl: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn nccl_communicators_are_kept_for_the_next_backend() {
    use seistomo::backend::cuda::{communicators_made, probe_device, CudaBackend};
    drop(gpu());
    if let Err(why) = probe_device(1) {
        println!("one GPU only: this test needs two ({why})");
        return;
    }
    let n = 1000;
    let want: Vec<f64> = (0..n).map(|i| 2.0 * i as f64 + 1e6).collect();
    let before = communicators_made();
    for round in 0..3 {
        let got = common::on_thread_ranks(2, |c| {
            let rank = seistomo::comm::Comm::rank(c);
            let be = CudaBackend::new(rank).unwrap();
            let path = be
                .setup_allreduce(c, seistomo::backend::AllreducePath::Nccl, None, false)
                .unwrap();
            let v: Vec<f64> = (0..n).map(|i| i as f64 + 1e6 * rank as f64).collect();
            let mut d = be.upload(&v).unwrap();
            be.allreduce_sum(c, &mut d).unwrap();
            (path, be.to_host(&d).unwrap())
        });
        for (rank, (path, x)) in got.iter().enumerate() {
            assert!(
                path.starts_with("nccl"),
                "round {round} rank {rank}: {path}"
            );
            assert_eq!(x, &want, "round {round} rank {rank}: wrong sums");
        }
        assert_eq!(
            communicators_made() - before,
            2,
            "round {round}: the first backends make one communicator a rank, the next none"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn host_path_allreduce_sums_every_rank() {
    // Three "ranks" (threads, a backend each on GPU 0) sum vectors through the host path (no
    // NCCL set up: page-locked copies and the communicator's sum) of 1, 1000 and 393,293
    // values. Each rank's values are whole numbers, so the sum is exact in any order.
    let _ = gpu();
    for n in [1usize, 1000, (1 << 17) * 3 + 77] {
        let comms = seistomo::comm::ThreadComm::create(3);
        let got: Vec<Vec<f64>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let g = seistomo::backend::cuda::CudaBackend::new(0).unwrap();
                        let r = seistomo::comm::Comm::rank(c) as f64;
                        let v: Vec<f64> = (0..n).map(|i| (i % 1000) as f64 + 1e6 * r).collect();
                        let mut d = g.upload(&v).unwrap();
                        g.allreduce_sum(c, &mut d).unwrap();
                        let mut out = vec![0.0; n];
                        g.download(&d, &mut out).unwrap();
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<f64> = (0..n).map(|i| 3.0 * (i % 1000) as f64 + 3e6).collect();
        let wrong: Vec<usize> = (0..3).filter(|&r| got[r] != want).collect();
        assert!(wrong.is_empty(), "n {n}: wrong sums on ranks {wrong:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn vector_kernels_match_cpu() {
    let g = gpu();
    let c = CpuBackend::new();
    let bad = std::cell::RefCell::new(Vec::<String>::new());
    let same = |what: &str, n: usize, got: &[f64], want: &[f64]| {
        let diff = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if diff > 0 {
            bad.borrow_mut().push(format!(
                "{what} n={n}: {diff} elements differ, rel {:.2e}",
                rel(got, want)
            ));
        }
    };
    for &n in &[1usize, 31, 1000, 100_003, 2_000_001] {
        let x = rand_vec(n, n as u64);
        let y = rand_vec(n, n as u64 + 1);
        let v = rand_vec(n, n as u64 + 2);
        let (gx, gv) = (g.upload(&x).unwrap(), g.upload(&v).unwrap());
        let mut gy = g.upload(&y).unwrap();
        same("upload/download", n, &down(&g, &gy), &y);
        let mut cy = y.clone();
        c.axpby(1.5, &x, -0.25, &mut cy).unwrap();
        g.axpby(1.5, &gx, -0.25, &mut gy).unwrap();
        same("axpby", n, &down(&g, &gy), &cy);
        c.scale(&mut cy, -3.0).unwrap();
        g.scale(&mut gy, -3.0).unwrap();
        same("scale", n, &down(&g, &gy), &cy);
        let mut gz = g.zeros(n).unwrap();
        let mut cz = vec![0.0; n];
        c.pointwise_mul(&x, &y, &mut cz).unwrap();
        let gyy = g.upload(&y).unwrap();
        g.pointwise_mul(&gx, &gyy, &mut gz).unwrap();
        same("pointwise_mul", n, &down(&g, &gz), &cz);
        g.fill(&mut gz, 2.5).unwrap();
        same("fill", n, &down(&g, &gz), &vec![2.5; n]);
        g.copy(&gx, &mut gz).unwrap();
        same("copy", n, &down(&g, &gz), &x);
        // reductions: deterministic and equal to the CPU's within rounding
        let (cd, gd) = (c.dot(&x, &y).unwrap(), g.dot(&gx, &gyy).unwrap());
        if (cd - gd).abs() > 1e-12 * (1.0 + cd.abs()) {
            bad.borrow_mut().push(format!("dot n={n}: {cd} vs {gd}"));
        }
        if gd.to_bits() != g.dot(&gx, &gyy).unwrap().to_bits() {
            bad.borrow_mut()
                .push(format!("dot n={n}: not reproducible"));
        }
        let (cn, gn) = (c.norm_sq(&x).unwrap(), g.norm_sq(&gx).unwrap());
        if (cn - gn).abs() > 1e-12 * cn {
            bad.borrow_mut()
                .push(format!("norm_sq n={n}: {cn} vs {gn}"));
        }
        // fused LSQR step, with and without var
        let step = XwStep {
            t1: 0.7,
            t2: -0.3,
            inv_rho: 1.9,
        };
        for with_var in [false, true] {
            let (mut cx, mut cw) = (x.clone(), y.clone());
            let mut cvar = vec![0.5; n];
            let (mut gx2, mut gw) = (g.upload(&x).unwrap(), g.upload(&y).unwrap());
            let mut gvar = g.upload(&vec![0.5; n]).unwrap();
            let cs = c
                .lsqr_update(
                    step,
                    &v,
                    XwState {
                        x: &mut cx,
                        w: &mut cw,
                        var: with_var.then_some(&mut cvar),
                    },
                )
                .unwrap();
            let gs = g
                .lsqr_update(
                    step,
                    &gv,
                    XwState {
                        x: &mut gx2,
                        w: &mut gw,
                        var: with_var.then_some(&mut gvar),
                    },
                )
                .unwrap();
            if (cs - gs).abs() > 1e-12 * cs {
                bad.borrow_mut()
                    .push(format!("lsqr_update n={n}: {cs} vs {gs}"));
            }
            same("lsqr_update x", n, &down(&g, &gx2), &cx);
            same("lsqr_update w", n, &down(&g, &gw), &cw);
            same("lsqr_update var", n, &down(&g, &gvar), &cvar);
        }
    }
    let bad = bad.into_inner();
    for b in &bad {
        println!("MISMATCH {b}");
    }
    assert!(bad.is_empty(), "{} mismatches", bad.len());
    // Length mismatches are errors, not panics.
    let a = g.zeros(3).unwrap();
    let mut b = g.zeros(4).unwrap();
    assert!(g.axpby(1.0, &a, 1.0, &mut b).is_err());
    assert!(g.copy(&a, &mut b).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn sparse_products_match_cpu_all_strategies_and_precisions() {
    let g = gpu();
    let c = CpuBackend::new();
    for (si, &(m, n)) in SHAPES
        .iter()
        .enumerate()
        .flat_map(|p| [p, p])
        .enumerate()
        .map(|(k, (si, mn))| (si + 100 * (k % 2), mn))
    {
        let a = awkward_csr(m, n, 100 + si as u64);
        let x = rand_vec(n, 7);
        let y = rand_vec(m, 8);
        for p in [Precision::F64, Precision::F32] {
            let ar = if p == Precision::F32 {
                rounded(&a)
            } else {
                a.clone()
            };
            let cop = CpuCsrOperator::new(ar.clone(), TransposeStrategy::Csc);
            for s in STRATEGIES {
                if s == TransposeStrategy::Library && p == Precision::F32 {
                    assert!(CudaCsrOperator::new(&g, &a, s, p).is_err());
                    continue;
                }
                let gop = CudaCsrOperator::new(&g, &a, s, p).unwrap();
                assert_eq!(gop.strategy(), s);
                let gx = g.upload(&x).unwrap();
                for (alpha, beta) in [(1.0, 0.0), (-0.5, 2.0), (2.0, 1.0)] {
                    for (t, what) in [(false, "A x"), (true, "A^T y")] {
                        let (inp, out) = if t { (&y, &x) } else { (&x, &y) };
                        let (gh, ch) = products((&c, &cop), (&g, &gop), t, alpha, inp, beta, out);
                        let e = rel(&gh, &ch);
                        let worst = gh
                            .iter()
                            .zip(&ch)
                            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-300))
                            .fold(0.0f64, f64::max);
                        if alpha == -0.5 && (t || s == TransposeStrategy::Csc) {
                            println!(
                                "{what} {m}x{n} {s} {p}: norm-wise {e:.2e}, worst element {worst:.2e}"
                            );
                        }
                        assert!(e <= 1e-13, "{what} {m}x{n} {s} {p} ({alpha},{beta}): {e}");
                    }
                }
                // Wrong vector lengths are errors.
                let mut bad = g.zeros(m + 1).unwrap();
                assert!(gop.apply(&g, Scale::SET, &gx, &mut bad).is_err());
            }
        }
    }
}

/// Relative spread of x (and var) after LSQR on the CPU when the same problem is solved with
/// its rows and columns permuted (a different summation order everywhere, the same problem in
/// exact arithmetic): how much this problem itself amplifies rounding.
fn order_spread(a: &Csr, b: &[f64], params: &LsqrParams) -> (f64, f64) {
    let (m, n) = a.shape();
    let mut r = Rng::new(5);
    let mut rp: Vec<usize> = (0..m).collect();
    let mut cp: Vec<usize> = (0..n).collect();
    for i in (1..m).rev() {
        rp.swap(i, r.below(i as u64 + 1) as usize);
    }
    for i in (1..n).rev() {
        cp.swap(i, r.below(i as u64 + 1) as usize);
    }
    // Permuted matrix P A Q: row i of it is row rp[i] of A; column j of A becomes cinv[j].
    let mut cinv = vec![0usize; n];
    for (j, &c0) in cp.iter().enumerate() {
        cinv[c0] = j;
    }
    let (mut ri, mut ci, mut vi) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &r0) in rp.iter().enumerate() {
        let (cols, vals) = a.row(r0);
        for (&cc, &vv) in cols.iter().zip(vals) {
            ri.push(i as u64);
            ci.push(cinv[cc as usize] as u64);
            vi.push(vv);
        }
    }
    let ap = Csr::from_triplets(m, n, &ri, &ci, &vi).unwrap();
    let bp: Vec<f64> = rp.iter().map(|&i| b[i]).collect();
    let s0 = cpu_csr_lsqr(a, TransposeStrategy::Csc, b, params);
    let s1 = cpu_csr_lsqr(&ap, TransposeStrategy::Csc, &bp, params);
    let x1: Vec<f64> = (0..n).map(|j| s1.x[cinv[j]]).collect();
    let (v0, v1) = (s0.var.unwrap_or_default(), s1.var.unwrap_or_default());
    let v1: Vec<f64> = (0..v1.len()).map(|j| v1[cinv[j]]).collect();
    (
        rel(&x1, &s0.x),
        if v0.is_empty() { 0.0 } else { rel(&v1, &v0) },
    )
}

/// LSQR on the CPU through the CSR kernels with transpose strategy `s`.
fn cpu_csr_lsqr(
    a: &Csr,
    s: TransposeStrategy,
    b: &[f64],
    params: &LsqrParams,
) -> seistomo::solver::LsqrSolution {
    common::cpu_lsqr(&CpuCsrOperator::new(a.clone(), s), b, None, params)
}

/// The awkward shapes as LSQR problems: (m, n, A, b, params), params 50 iterations of damped
/// LSQR with var and no stopping test.
fn awkward_lsqr_problems() -> impl Iterator<Item = (usize, usize, Csr, Vec<f64>, LsqrParams)> {
    SHAPES.iter().enumerate().map(|(si, &(m, n))| {
        let params = LsqrParams {
            damp: 0.5,
            atol: 0.0,
            btol: 0.0,
            conlim: 0.0,
            iter_lim: Some(50),
            calc_var: true,
        };
        (
            m,
            n,
            awkward_csr(m, n, 200 + si as u64),
            rand_vec(m, 9),
            params,
        )
    })
}

/// LSQR on the CPU in the GPU's summation and reduction orders.
fn gpu_order_lsqr(a: &Csr, b: &[f64], params: &LsqrParams) -> seistomo::solver::LsqrSolution {
    let g = GpuOrderCpu(CpuBackend::new());
    let op = WarpOrderOp {
        at: a.transpose(),
        a: a.clone(),
    };
    common::serial_lsqr(&g, &op, b, params)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn lsqr_iterates_match_cpu_after_50_iterations() {
    // The reference is the CPU run in the GPU's summation and reduction orders (kernels with a
    // fixed order must match it to 1e-10 and be bitwise reproducible). Atomics (scatter) and
    // cuSPARSE sum in an order of their own that changes from run to run; their bound comes
    // from an error analysis of that order instead of a fixed number:
    // - one product: the scatter kernel adds the terms fl(a_ij fl(alpha y_i)) to fl(beta x_j)
    //   in whatever order the atomics land. Any order of a sum of k terms t lies within
    //   gamma_(k-1) sum |t| of the exact sum (gamma_k = k u / (1 - k u), u = 2^-53: the sums
    //   are f64 whatever the value precision), so two orders, with the roundings of the
    //   products and the scaling, differ by at most d_j = 2 gamma_(k_j + 3) (|alpha| (|A|^T
    //   |y|)_j + |beta x_j|). The emulation below (the kernel's arithmetic, each product summed
    //   in a random order) checks that every product it makes lies within d of the fixed
    //   order's.
    // - 50 iterations: LSQR carries those differences on by a factor the problem sets (one
    //   dominant row loses orthogonality; after 50 iterations var of 300x9000 spreads over five
    //   decades from one order to the next: a heavy tail, which is why a single unlucky run
    //   once went past a fixed bound). The spread is measured by running the reference with
    //   each unfixed product in a random order (24 orders), and the GPU's runs are drawn from
    //   the same distribution: the median of 7 GPU runs must lie within 100x the emulated
    //   runs' 75th percentile (never required below 1e-10). A median does not feel the tail;
    //   a kernel that computes something else moves every run.
    struct AnyOrder {
        op: WarpOrderOp,
        /// A x in a random order too (cuSPARSE), not only A^T y.
        forward: bool,
        rng: std::cell::RefCell<Rng>,
        /// Products that left the error analysis's bound (none expected).
        outside: std::cell::Cell<usize>,
    }
    impl AnyOrder {
        /// out = alpha P v + beta out, P = A (`t` false) or A^T: in the reference's order
        /// where P's order is fixed, else as the scatter kernel adds (fl(beta out), then the
        /// terms fl(p fl(alpha v)) in a random order).
        fn product(&self, t: bool, s: Scale, v: &[f64], out: &mut [f64]) {
            let p = if t { &self.op.at } else { &self.op.a };
            if !(t || self.forward) {
                warp_order_spmv(p, s.alpha, v, s.beta, out);
                return;
            }
            let mut fixed = out.to_vec();
            warp_order_spmv(p, s.alpha, v, s.beta, &mut fixed);
            let mut bound: Vec<f64> = out.iter().map(|x| (s.beta * x).abs()).collect();
            for o in out.iter_mut() {
                *o = if s.beta == 0.0 { 0.0 } else { s.beta * *o };
            }
            // Row i of P^T: its terms go to the entries of `out` that P's columns name.
            let pt = if t { &self.op.a } else { &self.op.at };
            let mut terms = Vec::with_capacity(pt.nnz());
            for (i, vi) in v.iter().enumerate() {
                let scaled = s.alpha * vi;
                let (cols, vals) = pt.row(i);
                for (&c, &a) in cols.iter().zip(vals) {
                    terms.push((c as usize, a * scaled));
                    bound[c as usize] += (a * scaled).abs();
                }
            }
            let mut rng = self.rng.borrow_mut();
            for i in (1..terms.len()).rev() {
                terms.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for &(j, term) in &terms {
                out[j] += term;
            }
            let u = f64::EPSILON / 2.0;
            for (j, (o, f)) in out.iter().zip(&fixed).enumerate() {
                let k = (p.row(j).0.len() + 3) as f64;
                if (o - f).abs() > 2.0 * k * u / (1.0 - k * u) * bound[j] {
                    self.outside.set(self.outside.get() + 1);
                }
            }
        }
    }
    impl Operator<GpuOrderCpu> for AnyOrder {
        fn nrows(&self) -> usize {
            self.op.a.nrows()
        }
        fn ncols(&self) -> usize {
            self.op.a.ncols()
        }
        fn apply(
            &self,
            _: &GpuOrderCpu,
            s: Scale,
            x: &Vec<f64>,
            y: &mut Vec<f64>,
        ) -> seistomo::Result<()> {
            self.product(false, s, x, y);
            Ok(())
        }
        fn apply_t(
            &self,
            _: &GpuOrderCpu,
            s: Scale,
            y: &Vec<f64>,
            x: &mut Vec<f64>,
        ) -> seistomo::Result<()> {
            self.product(true, s, y, x);
            Ok(())
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p75 = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[(3 * v.len()) / 4]
    };
    // The distance of x and var from the reference's in 24 random orders, and how many
    // products left the analytic bound.
    let spread =
        |a: &Csr, b: &[f64], params: &LsqrParams, forward: bool, r: &(Vec<f64>, Vec<f64>)| {
            let (mut dx, mut dv, mut outside) = (Vec::new(), Vec::new(), 0);
            for seed in 0..24 {
                let op = AnyOrder {
                    op: WarpOrderOp {
                        at: a.transpose(),
                        a: a.clone(),
                    },
                    forward,
                    rng: std::cell::RefCell::new(Rng::new(31 + seed)),
                    outside: std::cell::Cell::new(0),
                };
                let g = GpuOrderCpu(CpuBackend::new());
                let s = common::serial_lsqr(&g, &op, b, params);
                dx.push(rel(&s.x, &r.0));
                dv.push(rel(s.var.as_ref().unwrap(), &r.1));
                outside += op.outside.get();
            }
            (p75(dx), p75(dv), outside)
        };
    let g = gpu();
    let mut bad = Vec::new();
    for (m, n, a, b, params) in awkward_lsqr_problems() {
        for p in [Precision::F64, Precision::F32] {
            let ar = if p == Precision::F32 {
                rounded(&a)
            } else {
                a.clone()
            };
            let plain = cpu_csr_lsqr(&ar, TransposeStrategy::Csc, &b, &params);
            let reference = gpu_order_lsqr(&ar, &b, &params);
            let r = (reference.x, reference.var.unwrap());
            for s in STRATEGIES {
                if s == TransposeStrategy::Library && p == Precision::F32 {
                    continue;
                }
                let gop = CudaCsrOperator::new(&g, &a, s, p).unwrap();
                // The host loop: this test checks the kernels' summation order against a CPU
                // run in that order (the device loop is checked in tests/gpu_compact.rs).
                gop.set_device_loop(false);
                let runs = if s == TransposeStrategy::Csc { 2 } else { 7 };
                let (mut ex, mut ev) = (Vec::new(), Vec::new());
                let mut first: Option<Vec<f64>> = None;
                for _ in 0..runs {
                    let gs = common::serial_lsqr(&g, &gop, &b, &params);
                    if gs.info.itn != plain.info.itn {
                        bad.push(format!("{m}x{n} {s} {p}: {} iterations", gs.info.itn));
                    }
                    ex.push(rel(&gs.x, &r.0));
                    ev.push(rel(gs.var.as_ref().unwrap(), &r.1));
                    let same = first.as_ref().is_none_or(|f| {
                        f.iter().zip(&gs.x).all(|(a, b)| a.to_bits() == b.to_bits())
                    });
                    if s == TransposeStrategy::Csc && !same {
                        bad.push(format!("{m}x{n} csc {p}: not reproducible"));
                    }
                    first.get_or_insert(gs.x);
                }
                let (e, ev) = (median(ex), median(ev));
                let (tx, tv) = if s == TransposeStrategy::Csc {
                    (1e-10, 1e-10)
                } else {
                    let forward = s == TransposeStrategy::Library;
                    let (sx, sv, outside) = spread(&ar, &b, &params, forward, &r);
                    if outside > 0 {
                        bad.push(format!(
                            "{m}x{n} {s} {p}: {outside} emulated products outside the bound"
                        ));
                    }
                    (1e-10f64.max(100.0 * sx), 1e-10f64.max(100.0 * sv))
                };
                println!(
                    "{m}x{n} {s} {p}: vs GPU-order CPU (median of {runs}): x {e:.2e} var {ev:.2e} (tol {tx:.1e} {tv:.1e}); vs plain CPU: x {:.2e}",
                    rel(first.as_ref().unwrap(), &plain.x)
                );
                if e > tx || ev > tv {
                    bad.push(format!("{m}x{n} {s} {p}: x {e:.2e}, var {ev:.2e}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn lsqr_on_australia_and_well1850_matches_cpu() {
    let (g, systems) = (gpu(), real_systems());
    for (name, sys, params) in systems {
        let cs = cpu_csr_lsqr(&sys.a, TransposeStrategy::Csc, &sys.b, &params);
        for s in STRATEGIES {
            let gop = CudaCsrOperator::new(&g, &sys.a, s, Precision::F64).unwrap();
            let gs = common::serial_lsqr(&g, &gop, &sys.b, &params);
            let e = rel(&gs.x, &cs.x);
            println!(
                "{name} {s} f64: istop {} itn {} (cpu {} {}), r1norm {:.10e} (cpu {:.10e}), x rel diff {e:.2e}",
                gs.info.istop, gs.info.itn, cs.info.istop, cs.info.itn, gs.info.norms.r1norm, cs.info.norms.r1norm
            );
            assert_eq!(gs.info.istop, cs.info.istop);
            assert!((gs.info.itn as f64 - cs.info.itn as f64).abs() <= 0.02 * cs.info.itn as f64);
            assert!(
                (gs.info.norms.r1norm - cs.info.norms.r1norm).abs() <= 1e-8 * cs.info.norms.r1norm
            );
            assert!(e <= 1e-6, "{name} {s}: {e}");
        }
        // The accuracy cost of f32 values (reported; LSQR must still converge).
        for s in [TransposeStrategy::Csc, TransposeStrategy::Scatter] {
            let gop = CudaCsrOperator::new(&g, &sys.a, s, Precision::F32).unwrap();
            let gs = common::serial_lsqr(&g, &gop, &sys.b, &params);
            let e = rel(&gs.x, &cs.x);
            println!(
                "{name} {s} f32: istop {} itn {}, r1norm {:.10e}, x rel diff to f64 CPU {e:.2e}",
                gs.info.istop, gs.info.itn, gs.info.norms.r1norm
            );
            assert!(
                gs.info.istop == 1 || gs.info.istop == 2,
                "{name} f32 istop {}",
                gs.info.istop
            );
            assert!(e <= 1e-3, "{name} {s} f32: {e}");
        }
    }
}

/// How far two CPU orderings (CSC gather vs per-thread scatter) drift apart after 50 LSQR
/// iterations on the awkward matrices: the scale against which the GPU is judged.
fn cpu_spread(a: &Csr, b: &[f64], params: &LsqrParams) -> f64 {
    let x1 = cpu_csr_lsqr(a, TransposeStrategy::Csc, b, params).x;
    let x2 = cpu_csr_lsqr(a, TransposeStrategy::Scatter, b, params).x;
    rel(&x2, &x1)
}

#[test]
fn cpu_summation_order_spread() {
    // Not a GPU test: shows how much each awkward problem amplifies a change of summation order
    // (the yardstick of the LSQR comparison above). Well-conditioned shapes must agree to 1e-10.
    for (m, n, a, b, params) in awkward_lsqr_problems() {
        let (sx, sv) = order_spread(&a, &b, &params);
        let e = cpu_spread(&a, &b, &params);
        println!("{m}x{n}: reordered x rel diff {sx:.2e}, var {sv:.2e}; csc vs scatter {e:.2e}");
        // The CSC product sums a column's terms in four lanes, the scatter in row order: two
        // orders, so they agree as well as any two orders do on the shape.
        if m > n {
            assert!(
                e <= 1e-10f64.max(10.0 * sx),
                "{m}x{n}: {e} (order spread {sx:.2e})"
            );
        }
    }
}

/// A CPU operator that sums every row longer than 32 nonzeros in the GPU's order (32 strided
/// lane sums, then the shuffle tree): isolates the effect of that summation order on LSQR.
struct WarpOrderOp {
    a: Csr,
    at: Csr,
}

fn warp_order_spmv(a: &Csr, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    let seg = segments(a.indptr());
    for w in seg.windows(2) {
        let (r0, r1) = (w[0] as usize, w[1] as usize);
        for (r, yr) in y.iter_mut().enumerate().take(r1).skip(r0) {
            let (cols, vals) = a.row(r);
            let sum = if r1 - r0 == 1 {
                let mut s = [0.0f64; 32];
                for (k, (&c, &v)) in cols.iter().zip(vals).enumerate() {
                    s[k % 32] += v * x[c as usize];
                }
                for o in [16, 8, 4, 2, 1] {
                    for l in 0..o {
                        s[l] += s[l + o];
                    }
                }
                s[0]
            } else {
                cols.iter()
                    .zip(vals)
                    .fold(0.0, |t, (&c, &v)| t + v * x[c as usize])
            };
            *yr = if beta == 0.0 {
                alpha * sum
            } else {
                alpha * sum + beta * *yr
            };
        }
    }
}

/// The same host kernels for the plain CPU backend and for [`GpuOrderCpu`].
impl<B: Backend<Vector = Vec<f64>>> Operator<B> for WarpOrderOp {
    fn nrows(&self) -> usize {
        self.a.nrows()
    }
    fn ncols(&self) -> usize {
        self.a.ncols()
    }
    fn apply(&self, _: &B, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> seistomo::Result<()> {
        warp_order_spmv(&self.a, s.alpha, x, s.beta, y);
        Ok(())
    }
    fn apply_t(&self, _: &B, s: Scale, y: &Vec<f64>, x: &mut Vec<f64>) -> seistomo::Result<()> {
        warp_order_spmv(&self.at, s.alpha, y, s.beta, x);
        Ok(())
    }
}

/// The GPU's dot-product order (kernels/vector.cu) on the CPU.
fn gpu_order_dot(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len();
    let g = n.div_ceil(1024).clamp(1, 1024);
    let stride = g * 256;
    let block_sum = |v: &[f64; 256]| {
        let mut sh = [0.0f64; 8];
        for (w, s) in sh.iter_mut().enumerate() {
            let mut l = [0.0f64; 32];
            l.copy_from_slice(&v[32 * w..32 * w + 32]);
            for o in [16, 8, 4, 2, 1] {
                for i in 0..o {
                    l[i] += l[i + o];
                }
            }
            *s = l[0];
        }
        sh.iter().fold(0.0, |t, &s| t + s)
    };
    let mut partial = vec![0.0; g];
    for (b, p) in partial.iter_mut().enumerate() {
        let mut v = [0.0f64; 256];
        for (t, vt) in v.iter_mut().enumerate() {
            let mut i = b * 256 + t;
            while i < n {
                *vt += x[i] * y[i];
                i += stride;
            }
        }
        *p = block_sum(&v);
    }
    let mut v = [0.0f64; 256];
    for (t, vt) in v.iter_mut().enumerate() {
        let mut i = t;
        while i < g {
            *vt += partial[i];
            i += 256;
        }
    }
    block_sum(&v)
}

/// The CPU backend with the GPU's reduction order.
struct GpuOrderCpu(CpuBackend);

impl Backend for GpuOrderCpu {
    type Vector = Vec<f64>;
    fn name(&self) -> &'static str {
        "cpu-gpu-order"
    }
    fn describe(&self) -> String {
        self.name().into()
    }
    fn zeros(&self, n: usize) -> seistomo::Result<Vec<f64>> {
        self.0.zeros(n)
    }
    fn upload(&self, x: &[f64]) -> seistomo::Result<Vec<f64>> {
        self.0.upload(x)
    }
    fn download(&self, x: &Vec<f64>, out: &mut [f64]) -> seistomo::Result<()> {
        self.0.download(x, out)
    }
    fn len(&self, x: &Vec<f64>) -> usize {
        x.len()
    }
    fn copy(&self, s: &Vec<f64>, d: &mut Vec<f64>) -> seistomo::Result<()> {
        self.0.copy(s, d)
    }
    fn fill(&self, x: &mut Vec<f64>, v: f64) -> seistomo::Result<()> {
        self.0.fill(x, v)
    }
    fn scale(&self, x: &mut Vec<f64>, a: f64) -> seistomo::Result<()> {
        self.0.scale(x, a)
    }
    fn axpby(&self, a: f64, x: &Vec<f64>, b: f64, y: &mut Vec<f64>) -> seistomo::Result<()> {
        self.0.axpby(a, x, b, y)
    }
    fn pointwise_mul(&self, x: &Vec<f64>, y: &Vec<f64>, z: &mut Vec<f64>) -> seistomo::Result<()> {
        self.0.pointwise_mul(x, y, z)
    }
    fn dot(&self, x: &Vec<f64>, y: &Vec<f64>) -> seistomo::Result<f64> {
        Ok(gpu_order_dot(x, y))
    }
    fn norm_sq(&self, x: &Vec<f64>) -> seistomo::Result<f64> {
        Ok(gpu_order_dot(x, x))
    }
    fn lsqr_update(&self, k: XwStep, v: &Vec<f64>, s: XwState<Vec<f64>>) -> seistomo::Result<f64> {
        let wd: Vec<f64> = s.w.iter().map(|a| a * k.inv_rho).collect();
        let dk2 = gpu_order_dot(&wd, &wd);
        self.0.lsqr_update(k, v, s)?;
        Ok(dk2)
    }
    fn allreduce_sum(
        &self,
        comm: &dyn seistomo::comm::Comm,
        x: &mut Vec<f64>,
    ) -> seistomo::Result<()> {
        self.0.allreduce_sum(comm, x)
    }
}

#[test]
fn cpu_with_gpu_summation_and_reduction_order() {
    for (m, n, a, b, params) in awkward_lsqr_problems() {
        let s0 = cpu_csr_lsqr(&a, TransposeStrategy::Csc, &b, &params);
        let g = GpuOrderCpu(CpuBackend::new());
        let op = WarpOrderOp {
            at: a.transpose(),
            a,
        };
        let s1 = common::serial_lsqr(&g, &op, &b, &params);
        let e = rel(&s1.x, &s0.x);
        println!(
            "{m}x{n}: cpu with the GPU's sum and reduction orders: x rel diff {e:.2e}, var {:.2e}",
            rel(s1.var.as_ref().unwrap(), s0.var.as_ref().unwrap())
        );
        // Shapes without a dominant row are insensitive to the order.
        if m >= 8 * n || m < 10 {
            assert!(e <= 1e-10, "{m}x{n}: {e}");
        }
    }
}

/// `mpirun -np NP seistomo` with the GPU libraries' environment passed on; the caller adds the
/// command.
fn mpirun_seistomo(np: usize) -> std::process::Command {
    let mut c = common::mpi::mpirun();
    for var in ["LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE"] {
        if std::env::var_os(var).is_some() {
            c.args(["-x", var]);
        }
    }
    c.args(["-np", &np.to_string()]).arg(seistomo_bin());
    c
}

/// `seistomo solve` on australia on `np` GPUs (one rank each, NCCL between them when np > 1)
/// with `storage` and `loop_`: (x, iterations, istop, the loop report.json says ran).
fn australia_on_gpus(np: usize, storage: &str, loop_: &str) -> (Vec<f64>, u64, u64, bool) {
    use common::mpi::finish;
    let root = common::gpu::data_root();
    let dir = fresh_dir(&format!("seistomo-gpu2-{np}-{storage}-{loop_}"));
    let (sol, rep) = (dir.join("x.txt"), dir.join("report.json"));
    let mut c = mpirun_seistomo(np);
    c.arg("solve");
    for (flag, rel) in [
        ("--matrix", "datasets/australia/G.mtx.gz"),
        ("--rhs", "datasets/australia/d.txt"),
        ("--reg", "datasets/australia/R.mtx.gz"),
    ] {
        c.arg(flag).arg(root.join(rel));
    }
    c.args([
        "--reg-weight",
        "0.015",
        "--atol",
        "1e-10",
        "--btol",
        "1e-10",
    ])
    .args([
        "--backend",
        "cuda",
        "--storage",
        storage,
        "--lsqr-loop",
        loop_,
    ])
    .arg("--solution")
    .arg(&sol)
    .arg("--report")
    .arg(&rep);
    if np > 1 {
        c.args(["--allreduce", "nccl"]);
    }
    let out = finish(c);
    assert!(
        out.status.success(),
        "{np} GPUs {storage} {loop_}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let x = std::fs::read_to_string(&sol)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let r = common::read_json(&rep);
    let its = r["iterations"].as_u64().unwrap();
    let istop = r["istop"].as_u64().unwrap();
    let device = r["lsqr_loop"] == "device";
    (x, its, istop, device)
}

/// LSQR's device loop on two GPUs (one MPI rank each; NCCL sums A^T u and ||u||^2 inside the
/// loop's CUDA graph) against the host loop on the same two GPUs and against one GPU, with CSR
/// and compact storage: the same istop, iterations within 4 %, x within 1e-10 (only the order
/// of the sums differs). On a machine with one GPU it says so and returns; with two, mpirun
/// must be there.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn device_loop_on_two_gpus_matches_the_host_loop_and_one_gpu() {
    if !two_gpus_and_mpirun() {
        return;
    }
    for storage in ["csr", "compact"] {
        let (x1, its1, stop1, dev1) = australia_on_gpus(1, storage, "device");
        assert!(dev1, "{storage}: one GPU ran the host loop");
        for loop_ in ["device", "host"] {
            let (x2, its2, stop2, dev2) = australia_on_gpus(2, storage, loop_);
            assert_eq!(
                dev2,
                loop_ == "device",
                "{storage} {loop_}: report's device_loop"
            );
            let e = rel(&x2, &x1);
            println!(
                "{storage} 2 GPUs {loop_} loop: {its2} iterations (1 GPU {its1}), x rel {e:.2e}"
            );
            assert_eq!(stop2, stop1, "{storage} {loop_}: istop");
            assert!(
                its2.abs_diff(its1) <= 5.max(its1 / 25),
                "{storage} {loop_}: {its2} vs {its1}"
            );
            assert!(e <= 1e-10, "{storage} {loop_}: x rel diff {e:e}");
        }
    }
}

/// Whether this machine has a second GPU (the first is checked as every test here does: a
/// panic where there is none); two GPUs without mpirun fail the test.
fn two_gpus_and_mpirun() -> bool {
    drop(gpu());
    if let Err(why) = seistomo::backend::cuda::probe_device(1) {
        println!("one GPU only: this test needs two ({why})");
        return false;
    }
    assert!(common::mpi::have_mpirun(), "two GPUs but no mpirun");
    true
}

/// An empty directory `name` in the temporary directory (what an earlier run left removed).
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `seistomo square --kind convdiff --n N` written to DIR/cd.mtx (N^3 rows); its path.
fn convdiff_in(dir: &std::path::Path, n: u32) -> std::path::PathBuf {
    let m = dir.join("cd.mtx");
    let sq = common::seistomo()
        .args([
            "-q",
            "square",
            "--kind",
            "convdiff",
            "--n",
            &n.to_string(),
            "-o",
        ])
        .arg(&m)
        .output()
        .unwrap();
    assert!(
        sq.status.success(),
        "{}",
        String::from_utf8_lossy(&sq.stderr)
    );
    m
}

/// A fresh directory `name` with a synthetic dataset of 16,384 cells (32 x 32 x 16: four pieces
/// of 4096 columns at most) and 20,000 rays in `ds` (the two-GPU tests' system; synth's default
/// seed, not [`common::synth_dataset`]'s: the three-rank comparison's bounds were measured on
/// this one).
fn small_synthetic(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = fresh_dir(name);
    let ds = dir.join("ds");
    let synth = common::seistomo()
        .args(["-q", "synth", "-o"])
        .arg(&ds)
        .args(["--grid", "32,32,16", "--rays", "20000"])
        .args(["--norm-damping", "0.1", "--flattening", "0.5,0.5,0.5"])
        .output()
        .unwrap();
    assert!(
        synth.status.success(),
        "{}",
        String::from_utf8_lossy(&synth.stderr)
    );
    (dir, ds)
}

/// `invert` of the config file `cfg` (whose output goes to `out`) on `np` ranks under mpirun:
/// its report.json and solution.txt's bytes; `what` names the run in failures.
fn invert_under_mpirun(
    np: usize,
    cfg: &std::path::Path,
    out: &std::path::Path,
    what: &str,
) -> (serde_json::Value, Vec<u8>) {
    use common::mpi::finish;
    let mut c = mpirun_seistomo(np);
    c.args(["-q", "invert"]).arg(cfg);
    let o = finish(c);
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = common::read_json(&out.join("report.json"));
    (r, std::fs::read(out.join("solution.txt")).unwrap())
}

/// A^T u in pieces of the columns on two GPUs (tuning `atu_pieces`): each piece is summed over
/// the ranks while the next is made, by NCCL on a stream of its own, or through the ranks'
/// memory (each piece published as it is made and combined into v on a second stream). A
/// synthetic dataset of 16,384 cells (four pieces of 4096 columns at most), `invert` on two
/// ranks with the device loop: every path, piece count and layout gives the solution of NCCL's
/// whole product summed after it byte for byte (a sum of two values does not depend on their
/// order; v's partial sums do not depend on the pieces), and the same iterations.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn atu_pieces_on_two_gpus_give_the_whole_products_solution() {
    if !two_gpus_and_mpirun() {
        return;
    }
    let (dir, ds) = small_synthetic("seistomo-gpu2-atu-pieces");
    let run = |path: &str, layout: &str, pieces: &str| {
        let name = format!("{path}-{layout}-{pieces}");
        let out = dir.join(format!("out-{name}"));
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[dataset]\npath = \"{}\"\n[solver]\niter_lim = 120\n[backend]\nkind = \"cuda\"\nstorage = \"compact\"\nlsqr_loop = \"device\"\nallreduce = \"{path}\"\n[tuning]\ngpu_layout = \"{layout}\"\natu_pieces = {pieces}\nlsqr_block = 7\n[output]\ndir = \"{}\"\nmodel = \"\"\n",
                ds.join("dataset.toml").display(),
                out.display()
            ),
        )
        .unwrap();
        let (r, x) = invert_under_mpirun(2, &cfg, &out, &name);
        assert_eq!(r["lsqr_loop"], "device", "{name}: the host loop ran");
        let ran = r["allreduce"].as_str().unwrap_or_default();
        assert!(ran.starts_with(path), "{name}: {ran:?} ran");
        (x, r["iterations"].as_u64().unwrap())
    };
    for layout in ["split", "tiles", "rows"] {
        let (whole, its) = run("nccl", layout, "1");
        for path in ["nccl", "peer"] {
            for pieces in ["1", "2", "3", "4", "64"] {
                if (path, pieces) == ("nccl", "1") {
                    continue;
                }
                let (x, i) = run(path, layout, pieces);
                assert_eq!(i, its, "{path} {layout} {pieces}: iterations");
                assert!(
                    x == whole,
                    "{path}, {layout}, {pieces} pieces: the solution differs from NCCL's whole product's"
                );
                println!(
                    "2 GPUs, {path}, {layout}, atu_pieces = {pieces}: {i} iterations, the same solution"
                );
            }
        }
    }
}

/// LSQR's sums through the other GPUs' memory (`allreduce = "peer"`, CUDA IPC, the default on
/// one node): on two ranks the same solution as NCCL's byte for byte (a sum of two values does
/// not depend on their order) and the same iterations, for the compact storage (split and rows
/// layouts) and CSR, with blocks of 32 iterations and of 7 (an odd count: the exchange's
/// counters run on across replays); report.json says which path ran. On three ranks on two
/// GPUs (two share one: NCCL refuses that, `peer` does not start NCCL) the host loop's solution
/// with MPI's sums, within rounding (see below), and the same istop.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn peer_sums_on_two_gpus_give_nccls_solution() {
    if !two_gpus_and_mpirun() {
        return;
    }
    let (dir, ds) = small_synthetic("seistomo-gpu2-peer");
    let run = |np: usize, allreduce: &str, backend: &str| {
        let name = format!(
            "{np}-{allreduce}-{}",
            backend.replace(['\n', ' ', '"', '='], "")
        );
        let out = dir.join(format!("out-{name}"));
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[dataset]\npath = \"{}\"\n[solver]\niter_lim = 150\n[backend]\nkind = \"cuda\"\nallreduce = \"{allreduce}\"\n{backend}\n[output]\ndir = \"{}\"\nmodel = \"\"\n",
                ds.join("dataset.toml").display(),
                out.display()
            ),
        )
        .unwrap();
        let (r, x) = invert_under_mpirun(np, &cfg, &out, &name);
        let path = r["allreduce"].as_str().unwrap_or_default().to_string();
        (r, x, path)
    };
    let variants = [
        "storage = \"compact\"\nlsqr_loop = \"device\"\n[tuning]\ngpu_layout = \"split\"",
        "storage = \"compact\"\nlsqr_loop = \"device\"\n[tuning]\ngpu_layout = \"rows\"\nlsqr_block = 7",
        "storage = \"csr\"\nlsqr_loop = \"device\"",
        "storage = \"csr\"\nlsqr_loop = \"device\"\n[tuning]\nlsqr_block = 7",
    ];
    for v in variants {
        let (rn, xn, pn) = run(2, "nccl", v);
        let (rp, xp, pp) = run(2, "peer", v);
        let (ra, xa, pa) = run(2, "auto", v);
        let what = v.replace('\n', " ");
        assert!(pn.starts_with("nccl"), "{what}: nccl ran {pn:?}");
        assert!(pp.starts_with("peer"), "{what}: peer ran {pp:?}");
        assert!(
            pa.starts_with("peer"),
            "{what}: auto ran {pa:?} on one node"
        );
        for r in [&rn, &rp, &ra] {
            assert_eq!(r["lsqr_loop"], "device", "{what}: the host loop ran");
        }
        assert_eq!(rp["iterations"], rn["iterations"], "{what}: iterations");
        assert_eq!(rp["istop"], rn["istop"], "{what}: istop");
        assert!(xp == xn, "{what}: peer sums' solution differs from NCCL's");
        assert!(xa == xp, "{what}: auto's solution differs from peer's");
        println!(
            "2 GPUs, {what}: peer = nccl byte for byte, {} iterations",
            rp["iterations"]
        );
    }
    let parse = |x: &[u8]| -> Vec<f64> {
        String::from_utf8_lossy(x)
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    // Three ranks: a sum of three values depends on their order (MPI's differs from the rank
    // order), so the host loop is matched within LSQR's sensitivity to rounding on this system
    // (x within 1e-6, ||r|| within 1e-9: measured 1.6e-8 for x).
    let v = variants[0];
    let (rh, xh, ph) = run(3, "host", v);
    let (rp, xp, pp) = run(3, "peer", v);
    assert!(ph.starts_with("host"), "3 ranks: host ran {ph:?}");
    assert!(pp.starts_with("peer"), "3 ranks: peer ran {pp:?}");
    assert_eq!(rp["lsqr_loop"], "device", "3 ranks: peer ran the host loop");
    assert_eq!(rp["istop"], rh["istop"], "3 ranks: istop");
    let (ip, ih) = (
        rp["iterations"].as_u64().unwrap(),
        rh["iterations"].as_u64().unwrap(),
    );
    assert!(
        ip.abs_diff(ih) <= 2,
        "3 ranks: {ip} against {ih} iterations"
    );
    let e = rel(&parse(&xp), &parse(&xh));
    let r1 = |r: &serde_json::Value| r["r1norm"].as_f64().unwrap();
    let er = (r1(&rp) - r1(&rh)).abs() / r1(&rh);
    println!(
        "3 ranks on 2 GPUs: peer {ip} iterations, host {ih}, x rel {e:.2e}, r1norm rel {er:.2e}"
    );
    assert!(e <= 1e-6, "3 ranks: x rel diff {e:e}");
    assert!(er <= 1e-9, "3 ranks: r1norm rel diff {er:e}");
}

/// More ranks than GPUs (three ranks on two: ranks 0 and 2 share GPU 0). NCCL refuses such a
/// job (one rank fails, the others wait for it), so the ranks say so before NCCL starts:
/// LSQR with its host loop (NCCL made ahead of the read under `auto`) sums through the host
/// instead; GMRES with the defaults goes through the GPUs' memory (no NCCL) and converges as on
/// one rank, and so does `allreduce = "host"`; `allreduce = "nccl"` is one clear error, not a
/// hang.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn more_ranks_than_gpus_sum_through_the_host_instead_of_nccl() {
    use common::mpi::finish;
    if !two_gpus_and_mpirun() {
        return;
    }
    let (dir, ds) = small_synthetic("seistomo-gpu3-shared");
    let m = convdiff_in(&dir, 24);
    let gmres = |np: usize, extra: &[&str]| {
        let rep = dir.join(format!("g{np}{}.json", extra.join("")));
        let mut c = mpirun_seistomo(np);
        c.args(["-q", "solve", "--method", "gmres", "--matrix"])
            .arg(&m)
            .args(["--restart", "16", "--rtol", "1e-10", "--precond", "jacobi"])
            .args(["--backend", "cuda", "--report"])
            .arg(&rep)
            .args(extra);
        let o = finish(c);
        let r = o.status.success().then(|| common::read_json(&rep));
        (o, r)
    };
    let (o1, r1) = gmres(1, &[]);
    let r1 = r1.unwrap_or_else(|| panic!("1 rank: {}", String::from_utf8_lossy(&o1.stderr)));
    let i1 = r1["iterations"].as_u64().unwrap();
    for (extra, path) in [(&[][..], "peer"), (&["--allreduce", "host"][..], "host")] {
        let (o3, r3) = gmres(3, extra);
        let err3 = String::from_utf8_lossy(&o3.stderr).to_string();
        let r3 = r3.unwrap_or_else(|| panic!("3 ranks {extra:?}: {err3}"));
        assert_eq!(r3["converged"], true, "3 ranks {extra:?}: {r3}");
        let ran = r3["allreduce"].as_str().unwrap_or_default();
        assert!(ran.starts_with(path), "3 ranks {extra:?}: {ran}");
        let i3 = r3["iterations"].as_u64().unwrap();
        assert!(
            i3.abs_diff(i1) <= 2,
            "GMRES {extra:?}: {i3} iterations on 3 ranks, {i1} on one"
        );
        println!("GMRES on 3 ranks of 2 GPUs: {path} sums, {i3} iterations (1 rank {i1})");
    }
    let (on, _) = gmres(3, &["--allreduce", "nccl"]);
    let err = String::from_utf8_lossy(&on.stderr);
    assert!(!on.status.success(), "allreduce = nccl on a shared GPU ran");
    assert!(err.contains("two ranks share a GPU"), "{err}");
    // LSQR's host loop: NCCL would be made ahead of the read.
    let out = dir.join("out-lsqr-host");
    let cfg = dir.join("lsqr-host.toml");
    std::fs::write(
        &cfg,
        format!(
            "[dataset]\npath = \"{}\"\n[solver]\niter_lim = 60\n[backend]\nkind = \"cuda\"\nlsqr_loop = \"host\"\n[output]\ndir = \"{}\"\nmodel = \"\"\n",
            ds.join("dataset.toml").display(),
            out.display()
        ),
    )
    .unwrap();
    let (r, _) = invert_under_mpirun(3, &cfg, &out, "LSQR host loop on 3 ranks");
    assert!(
        r["allreduce"]
            .as_str()
            .unwrap_or_default()
            .starts_with("host"),
        "{}",
        r["allreduce"]
    );
    println!(
        "LSQR's host loop on 3 ranks of 2 GPUs: {} iterations, host sums",
        r["iterations"]
    );
}

/// LSMR on the GPU against LSMR on the CPU: every CSR transpose directly (the host loop with the
/// vectors on the device), the explicit transpose with the device loop too (kernels/lsmr.cu;
/// blocks of 32, and blocks ended every 7 iterations where a monitor asks for x), and compact
/// storage through the pipeline (`solve --method lsmr --storage compact`, the device loop). The
/// same istop, iterations within 2 %, ||r|| within 1e-8, x within 1e-6 (as LSQR's test: the
/// orders of the sums differ).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn lsmr_on_australia_and_well1850_matches_cpu() {
    use seistomo::pipeline::options::SolveOptions;
    use seistomo::pipeline::solve::solve_system;
    use seistomo::solver::{lsmr, LsqMethod};
    let (g, systems) = (gpu(), real_systems());
    for (name, sys, params) in systems {
        let cpu = CpuBackend::new();
        let cop = CpuCsrOperator::new(sys.a.clone(), TransposeStrategy::Csc);
        let cs = lsmr(
            &LeastSquares::new(&cpu, &cop, &SerialComm, &sys.b),
            &params,
            &mut NoMonitor,
        )
        .unwrap();
        let check = |what: &str, istop: u32, itn: usize, normr: f64, x: &[f64]| {
            let e = rel(x, &cs.x);
            println!(
                "{name} {what}: istop {istop} itn {itn} (cpu {} {}), normr {normr:.10e} (cpu {:.10e}), x rel diff {e:.2e}",
                cs.info.istop, cs.info.itn, cs.info.normr
            );
            assert_eq!(istop, cs.info.istop, "{name} {what}");
            assert!((itn as f64 - cs.info.itn as f64).abs() <= 0.02 * cs.info.itn as f64);
            assert!(
                (normr - cs.info.normr).abs() <= 1e-8 * cs.info.normr,
                "{name} {what}"
            );
            assert!(e <= 1e-6, "{name} {what}: {e}");
        };
        for s in STRATEGIES {
            let gop = CudaCsrOperator::new(&g, &sys.a, s, Precision::F64).unwrap();
            let gs = lsmr(
                &LeastSquares::new(&g, &gop, &SerialComm, &sys.b),
                &params,
                &mut NoMonitor,
            )
            .unwrap();
            let i = &gs.info;
            check(&format!("csr {s}"), i.istop, i.itn, i.normr, &gs.x);
        }
        // the device loop: whole blocks, and blocks that end where a monitor wants x
        let gop = CudaCsrOperator::new(&g, &sys.a, TransposeStrategy::Csc, Precision::F64).unwrap();
        gop.set_device_loop(true);
        assert!(gop.lsmr_device().is_some());
        let mut every7 = XEvery::default();
        let mut itn = 0;
        let monitors: [(&str, &mut dyn seistomo::solver::LsqrMonitor<_>); 2] = [
            ("csr csc, device loop", &mut NoMonitor),
            ("csr csc, device loop, blocks of 7", &mut every7),
        ];
        for (what, mon) in monitors {
            let gs = lsmr(
                &LeastSquares::new(&g, &gop, &SerialComm, &sys.b),
                &params,
                mon,
            )
            .unwrap();
            let i = &gs.info;
            check(what, i.istop, i.itn, i.normr, &gs.x);
            itn = i.itn;
        }
        assert_eq!(every7.records, (0..=itn).collect::<Vec<_>>());
        // maxiter 0 and 1: the device loop stops as the CPU's host loop does (istop 0 and 7)
        for k in [0, 1] {
            let p = LsqrParams {
                iter_lim: Some(k),
                ..params.clone()
            };
            let gi = lsmr(
                &LeastSquares::new(&g, &gop, &SerialComm, &sys.b),
                &p,
                &mut NoMonitor,
            )
            .unwrap()
            .info;
            let ci = lsmr(
                &LeastSquares::new(&cpu, &cop, &SerialComm, &sys.b),
                &p,
                &mut NoMonitor,
            )
            .unwrap()
            .info;
            assert_eq!(
                (gi.istop, gi.itn),
                (ci.istop, ci.itn),
                "{name}: maxiter {k}"
            );
        }
        let want: Vec<usize> = (7..=itn).step_by(7).collect();
        let got: Vec<usize> = every7.xs.iter().filter(|&&k| k % 7 == 0).copied().collect();
        assert_eq!(got, want, "{name}: x shown at every multiple of 7");
        let mut opts = SolveOptions::new(params.clone(), BackendChoice::Cuda);
        opts.method = LsqMethod::Lsmr;
        opts.operator.storage = seistomo::backend::storage::Storage::Compact;
        let o = solve_system(sys.clone(), &opts, &SerialComm, 0.0, 0).unwrap();
        assert_eq!(o.report.header.method, "lsmr");
        assert_eq!(o.report.lsqr_loop, "device");
        let i = &o.solution.info;
        let what = format!("pipeline, {}", o.report.storage);
        check(&what, i.istop, i.itn, i.norms.r1norm, &o.solution.x);
    }
}

/// A CSR matrix's arrays on the GPU as another library (CuPy) holds them: row offsets of
/// `width` bytes (i32 or i64), i32 columns, values of `p`.
struct ForeignCsr {
    indptr: cudarc::driver::CudaSlice<u8>,
    indices: cudarc::driver::CudaSlice<u32>,
    values: cudarc::driver::CudaSlice<u8>,
    shape: (usize, usize, usize),
    width: usize,
    p: Precision,
}

impl ForeignCsr {
    fn upload(
        g: &seistomo::backend::cuda::CudaBackend,
        a: &Csr,
        width: usize,
        p: Precision,
    ) -> Self {
        let s = g.stream();
        let indptr: Vec<u8> = a
            .indptr()
            .iter()
            .flat_map(|&v| {
                if width == 4 {
                    (v as i32).to_ne_bytes().to_vec()
                } else {
                    (v as i64).to_ne_bytes().to_vec()
                }
            })
            .collect();
        let values: Vec<u8> = a
            .data()
            .iter()
            .flat_map(|&v| match p {
                Precision::F64 => v.to_ne_bytes().to_vec(),
                Precision::F32 => (v as f32).to_ne_bytes().to_vec(),
            })
            .collect();
        ForeignCsr {
            indptr: s.clone_htod(&indptr).unwrap(),
            indices: s.clone_htod(a.indices()).unwrap(),
            values: s.clone_htod(&values).unwrap(),
            shape: (a.nrows(), a.ncols(), a.nnz()),
            width,
            p,
        }
    }

    fn device(&self, g: &seistomo::backend::cuda::CudaBackend) -> seistomo::Result<DeviceCsr> {
        use cudarc::driver::DevicePtr;
        let s = g.stream();
        let (ip, _a) = self.indptr.device_ptr(s);
        let (ix, _b) = self.indices.device_ptr(s);
        let (v, _c) = self.values.device_ptr(s);
        g.synchronize().unwrap();
        let (m, n, nnz) = self.shape;
        // SAFETY: the three buffers are this struct's live device allocations of m + 1 offsets
        // of `width` bytes, nnz u32 columns and nnz values of `p`, written (synchronised above)
        // and unchanged while the test uses the DeviceCsr.
        unsafe { DeviceCsr::new((m, n), nnz, (ip, self.width), ix, v, self.p) }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn a_matrix_on_the_gpu_runs_as_the_uploaded_one() {
    // CuPy's arrays (i32 or i64 row offsets, i32 columns, f64 or f32 values) copied device to
    // device: the same products and the same LSQR solve, bit for bit, as the matrix uploaded
    // from the host with the explicit transpose.
    let g = gpu();
    for (k, &(m, n)) in SHAPES.iter().enumerate() {
        let a = awkward_csr(m, n, 300 + k as u64);
        let at = a.transpose();
        let b = rand_vec(m, 9);
        for (p, width) in [(Precision::F64, 4), (Precision::F32, 8)] {
            let (fa, fat) = (
                ForeignCsr::upload(&g, &a, width, p),
                ForeignCsr::upload(&g, &at, width, p),
            );
            let (da, dat) = (fa.device(&g).unwrap(), fat.device(&g).unwrap());
            let dev = CudaCsrOperator::from_device(&g, &da, &dat, &Default::default()).unwrap();
            let up = CudaCsrOperator::new(&g, &a, TransposeStrategy::Csc, p).unwrap();
            for t in [false, true] {
                let (inp, out) = if t {
                    (rand_vec(m, 5), rand_vec(n, 6))
                } else {
                    (rand_vec(n, 5), rand_vec(m, 6))
                };
                let (gi, mut g1) = (g.upload(&inp).unwrap(), g.upload(&out).unwrap());
                let mut g2 = g.upload(&out).unwrap();
                let s = Scale::new(-0.5, 2.0);
                if t {
                    dev.apply_t(&g, s, &gi, &mut g1).unwrap();
                    up.apply_t(&g, s, &gi, &mut g2).unwrap();
                } else {
                    dev.apply(&g, s, &gi, &mut g1).unwrap();
                    up.apply(&g, s, &gi, &mut g2).unwrap();
                }
                assert_eq!(down(&g, &g1), down(&g, &g2), "{m}x{n} {p} transpose {t}");
            }
            let params = LsqrParams {
                atol: 1e-10,
                btol: 1e-10,
                iter_lim: Some(60),
                ..Default::default()
            };
            for op_loop in [false, true] {
                dev.set_device_loop(op_loop);
                up.set_device_loop(op_loop);
                let solve = |op: &CudaCsrOperator| {
                    seistomo::solver::lsqr(
                        &LeastSquares::new(&g, op, &SerialComm, &b),
                        &params,
                        &mut NoMonitor,
                    )
                    .unwrap()
                };
                let (s1, s2) = (solve(&dev), solve(&up));
                assert_eq!(s1.x, s2.x, "{m}x{n} {p} device loop {op_loop}");
                assert_eq!(s1.info.itn, s2.info.itn);
            }
        }
    }
    // What the addresses cannot say is checked where it can be: a transpose of another shape,
    // decreasing row offsets.
    let a = awkward_csr(50, 20, 7);
    let dat = ForeignCsr::upload(&g, &a.transpose(), 4, Precision::F64);
    let dat = dat.device(&g).unwrap();
    let e = CudaCsrOperator::from_device(&g, &dat, &dat, &Default::default());
    assert!(e.err().unwrap().to_string().contains("is not that of the"));
    let mut fb = ForeignCsr::upload(&g, &a, 8, Precision::F64);
    let mut raw = a.indptr().to_vec();
    let r = (0..50).find(|&r| raw[r + 1] > raw[r]).unwrap();
    raw.swap(r, r + 1);
    let bytes: Vec<u8> = raw.iter().flat_map(|&v| (v as i64).to_ne_bytes()).collect();
    fb.indptr = g.stream().clone_htod(&bytes).unwrap();
    let e = CudaCsrOperator::from_device(&g, &fb.device(&g).unwrap(), &dat, &Default::default());
    let msg = e.err().unwrap().to_string();
    assert!(msg.contains("bad row offsets"), "{msg}");
    // SAFETY: never read: the constructor refuses the arguments before any use.
    let w = unsafe { DeviceCsr::new((5, 5), 3, (8, 2), 8, 8, Precision::F64) };
    assert!(w.err().unwrap().to_string().contains("32- or 64-bit"));
}

/// A monitor that wants x every 7 iterations (as Python's `callback_type="x"`): the records it
/// saw and the iterations it was shown x at.
#[derive(Default)]
struct XEvery {
    records: Vec<usize>,
    xs: Vec<usize>,
}

impl seistomo::solver::LsqrMonitor<seistomo::backend::cuda::CudaBackend> for XEvery {
    fn record(&mut self, rec: &seistomo::solver::IterRecord) -> seistomo::Result<()> {
        self.records.push(rec.itn);
        Ok(())
    }
    fn checkpoint_every(&self) -> usize {
        7
    }
    fn lsmr_iterate(
        &mut self,
        _be: &seistomo::backend::cuda::CudaBackend,
        itn: usize,
        _x: &<seistomo::backend::cuda::CudaBackend as Backend>::Vector,
    ) -> seistomo::Result<()> {
        self.xs.push(itn);
        Ok(())
    }
}

/// GMRES's halo and sums through the other GPUs' memory (`allreduce = "peer"`, the default on
/// the GPUs of one node; kernels/peer.cu): on two ranks the same x as NCCL's and as the host
/// path's, byte for byte (a halo is copied and a sum of two values does not depend on their
/// order), and the same iterations, for row patterns (the halo beside the interior rows, on a
/// stream of its own) and CSR (the exchange before the product), with the device Arnoldi loop
/// (cgs, cgs2) and the host loop (mgs); report.json says which path ran. On three ranks on
/// two GPUs: one rank's iterations (within one) and x within 1e-9.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn gmres_peer_halo_and_sums_give_nccls_solution() {
    use common::mpi::finish;
    if !two_gpus_and_mpirun() {
        return;
    }
    let dir = fresh_dir("seistomo-gpu2-gmres-peer");
    let m = convdiff_in(&dir, 32);
    let run = |np: usize, allreduce: &str, storage: &str, orthog: &str| {
        let name = format!("{np}-{allreduce}-{storage}-{orthog}");
        let (rep, sol) = (
            dir.join(format!("{name}.json")),
            dir.join(format!("{name}.txt")),
        );
        let mut c = mpirun_seistomo(np);
        c.args(["-q", "solve", "--method", "gmres", "--matrix"])
            .arg(&m)
            .args(["--restart", "16", "--rtol", "1e-10", "--precond", "jacobi"])
            .args([
                "--backend",
                "cuda",
                "--storage",
                storage,
                "--orthog",
                orthog,
            ])
            .args(["--allreduce", allreduce, "--report"])
            .arg(&rep)
            .arg("--solution")
            .arg(&sol);
        let o = finish(c);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = common::read_json(&rep);
        assert_eq!(r["converged"], true, "{name}: {r}");
        (r, std::fs::read(&sol).unwrap(), name)
    };
    let path = |r: &serde_json::Value| r["allreduce"].as_str().unwrap_or_default().to_string();
    let floats = |b: &[u8]| -> Vec<f64> {
        String::from_utf8_lossy(b)
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    for (storage, orthog) in [
        ("compact", "cgs"),
        ("csr", "cgs"),
        ("compact", "cgs2"),
        ("compact", "mgs"),
    ] {
        let (rn, xn, _) = run(2, "nccl", storage, orthog);
        assert!(
            path(&rn).starts_with("nccl"),
            "{storage} {orthog}: {}",
            path(&rn)
        );
        let device = orthog != "mgs";
        assert_eq!(
            rn["arnoldi_loop"] == "device",
            device,
            "{storage} {orthog}: {rn}"
        );
        for allreduce in ["peer", "auto", "host"] {
            let (r, x, name) = run(2, allreduce, storage, orthog);
            let want = if allreduce == "host" { "host" } else { "peer" };
            assert!(path(&r).starts_with(want), "{name}: ran {}", path(&r));
            assert_eq!(r["storage"], rn["storage"], "{name}");
            assert_eq!(r["iterations"], rn["iterations"], "{name}");
            assert!(x == xn, "{name}: x differs from NCCL's");
        }
        println!(
            "GMRES {storage} {orthog} on 2 GPUs: peer, auto, host = nccl byte for byte ({} iterations, {})",
            rn["iterations"], rn["storage"]
        );
        let (r1, x1, _) = run(1, "auto", storage, orthog);
        let (r3, x3, name) = run(3, "peer", storage, orthog);
        assert!(path(&r3).starts_with("peer"), "{name}: ran {}", path(&r3));
        let (i1, i3) = (
            r1["iterations"].as_u64().unwrap(),
            r3["iterations"].as_u64().unwrap(),
        );
        let e = rel(&floats(&x3), &floats(&x1));
        println!("GMRES {storage} {orthog} on 3 ranks of 2 GPUs, peer: {i3} iterations (1 rank {i1}), x rel {e:.1e}");
        assert!(i3.abs_diff(i1) <= 1, "{name}: {i3} vs {i1}");
        assert!(e <= 1e-9, "{name}: x rel diff {e:e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `seistomo bench --sums` on two GPUs: every path (the GPUs' memory, NCCL, the host)
/// sums the vector right (the command checks every value) and reports its times and nccl-tests'
/// bandwidths.
#[test]
#[ignore = "needs two CUDA GPUs and mpirun: run with --include-ignored where they are (bench/gpu.sh tests)"]
fn bench_sums_times_every_path_on_two_gpus() {
    use common::mpi::finish;
    if !two_gpus_and_mpirun() {
        return;
    }
    let dir = fresh_dir("seistomo-gpu2-bench-sums");
    let json = dir.join("sums.json");
    let mut c = mpirun_seistomo(2);
    c.args(["bench", "--sums", "131073", "--iters", "20", "--json"])
        .arg(&json);
    let o = finish(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    println!("{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(paths, ["peer", "nccl", "host"], "{rows:?}");
    for r in &rows {
        assert_eq!(r["values"], 131073);
        assert!(r["median_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["busbw_gbs"].as_f64().unwrap() > 0.0, "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
