//! Compact storage, stencil damping and the device-resident LSQR loop on the GPU, against the
//! CPU backend (the reference). Every test needs a GPU, so it is `#[ignore]`d (counted as
//! ignored where there is none) and runs with `--include-ignored` on the GPU machine
//! (bench/gpu.sh tests), where it fails if no usable GPU is found.

mod common;

use common::gpu::{down, gpu, products, rand_vec, real_systems, rel};

use seistomo::backend::cpu::{CpuBackend, CpuCompactOperator};
use seistomo::backend::cuda::{CudaBackend, CudaCompactOperator, CudaCsrOperator};
use seistomo::backend::{Backend, Operator, Precision, Scale, TransposeStrategy};
use seistomo::comm::SerialComm;
use seistomo::grid::Rng;
use seistomo::grid::{Stencil, StencilOp};
use seistomo::settings::tuning::{GpuLayout, Tuning as CompactGpuOptions};
use seistomo::solver::{
    lsqr, lsqr_iterate, lsqr_start, History, IterRecord, LeastSquares, LsqrMonitor, LsqrParams,
    LsqrScalars, LsqrVectors,
};
use seistomo::sparse::Csr;
use seistomo::testproblems::awkward_csr;

/// Matrices with the awkward shapes of the issue: column steps >= 65536 (escapes), empty rows,
/// one huge row, columns never touched, m < n, and a tiny one.
fn awkward() -> Vec<Csr> {
    vec![
        awkward_csr(2000, 700, 11),
        awkward_csr(300, 200_000, 12),
        awkward_csr(50_000, 64, 13),
        awkward_csr(7, 3, 14),
        awkward_csr(8000, 2000, 15),
    ]
}

fn stencil_for(ncells: usize) -> Option<Stencil> {
    // a grid with exactly ncells cells when one exists among a few shapes
    for n in [[10, 7, 10], [4, 4, 4], [8, 8, 1], [64, 1, 1], [20, 10, 10]] {
        if n[0] * n[1] * n[2] == ncells {
            return Some(Stencil {
                n,
                norm: 0.1,
                first: [0.5, 0.0, 0.25],
                second: [0.0, 0.3, 0.0],
            });
        }
    }
    None
}

fn random_perm(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        p.swap(i, rng.below(i as u64 + 1) as usize);
    }
    p
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn compact_products_match_cpu_every_shape_width_and_precision() {
    let g = gpu();
    let c = CpuBackend::new();
    let mut mats = awkward();
    // a stencil system: 700 kernel-like rows on a 10x7x10 grid + its damping stencil
    mats.push(awkward_csr(700, 700, 16));
    for (mi, a) in mats.iter().enumerate() {
        let (m, n) = (a.nrows(), a.ncols());
        let st = stencil_for(n).map(|s| StencilOp::new(s, Some(random_perm(n, 5))));
        let mrows = m + st.as_ref().map_or(0, |s| s.nrows());
        let x = rand_vec(n, 21);
        let y = rand_vec(mrows, 22);
        for p in [Precision::F64, Precision::F32] {
            let cop = CpuCompactOperator::new(a, st.clone(), p);
            let rows = |shape: Option<(u32, u32)>| CompactGpuOptions {
                gpu_layout: Some(GpuLayout::Rows),
                compact_s: shape.map(|(s, _)| s),
                compact_r: shape.map(|(_, r)| r),
                ..Default::default()
            };
            let tiles = |bits| CompactGpuOptions {
                gpu_layout: Some(GpuLayout::Tiles),
                tile_bits: Some(bits),
                ..Default::default()
            };
            let mixed = |bits| CompactGpuOptions {
                gpu_layout: Some(GpuLayout::Mixed),
                tile_bits: Some(bits),
                ..Default::default()
            };
            let split = |bits, ax| CompactGpuOptions {
                gpu_layout: Some(GpuLayout::Split),
                tile_bits: Some(bits),
                ax_tile_bits: Some(ax),
                ..Default::default()
            };
            for o in [
                rows(None),
                rows(Some((4, 1))),
                rows(Some((8, 3))),
                rows(Some((16, 2))),
                rows(Some((32, 5))),
                tiles(4),
                tiles(9),
                tiles(12),
                mixed(4),
                mixed(9),
                split(4, 6),
                split(9, 12),
                split(12, 4),
            ] {
                let shape = (
                    o.gpu_layout,
                    o.tile_bits,
                    o.ax_tile_bits,
                    o.compact_s,
                    o.compact_r,
                );
                let gop = CudaCompactOperator::with_options(&g, a, st.as_ref(), p, &o).unwrap();
                assert_eq!(gop.nrows(), mrows);
                let gx = g.upload(&x).unwrap();
                for (alpha, beta) in [(1.0, 0.0), (-0.5, 2.0), (2.0, 1.0)] {
                    let ops = ((&c, &cop), (&g, &gop));
                    let (gyh, cy) = products(ops.0, ops.1, false, alpha, &x, beta, &y);
                    let e = rel(&gyh, &cy);
                    assert!(e <= 1e-13, "A x #{mi} {m}x{n} {p} {shape:?}: {e:.2e}");
                    // the stencil rows sum in the CPU's order: bitwise equal
                    for (r, (gv, cv)) in gyh.iter().zip(&cy).enumerate().skip(m) {
                        assert_eq!(gv.to_bits(), cv.to_bits(), "stencil row {r}");
                    }
                    let (gxh, cx) = products(ops.0, ops.1, true, alpha, &y, beta, &x);
                    let e = rel(&gxh, &cx);
                    assert!(e <= 1e-13, "A^T y #{mi} {m}x{n} {p} {shape:?}: {e:.2e}");
                }
                let mut bad = g.zeros(mrows + 1).unwrap();
                assert!(gop.apply(&g, Scale::SET, &gx, &mut bad).is_err());
            }
            println!("#{mi} {m}x{n} {p}: compact products match the CPU (rows and tiles)");
        }
    }
}

/// Records the history and keeps the state at one iteration (a checkpoint).
struct Keep {
    at: usize,
    every: usize,
    hist: Vec<IterRecord>,
    saved: Option<(LsqrScalars, [Vec<f64>; 4])>,
}

impl LsqrMonitor<CudaBackend> for Keep {
    fn record(&mut self, r: &IterRecord) -> seistomo::Result<()> {
        self.hist.push(*r);
        Ok(())
    }
    fn checkpoint_every(&self) -> usize {
        self.every
    }
    fn state(
        &mut self,
        be: &CudaBackend,
        s: &LsqrScalars,
        v: &LsqrVectors<<CudaBackend as Backend>::Vector>,
    ) -> seistomo::Result<()> {
        if s.itn == self.at {
            self.saved = Some((
                s.clone(),
                [
                    down(be, &v.u),
                    down(be, &v.v),
                    down(be, &v.w),
                    down(be, &v.x),
                ],
            ));
        }
        Ok(())
    }
}

/// The precisions and layouts the device loop is checked in.
fn layouts() -> Vec<(Precision, GpuLayout, CompactGpuOptions)> {
    [
        (Precision::F64, GpuLayout::Rows),
        (Precision::F32, GpuLayout::Rows),
        (Precision::F64, GpuLayout::Tiles),
        (Precision::F64, GpuLayout::Mixed),
        (Precision::F32, GpuLayout::Mixed),
        (Precision::F32, GpuLayout::Split),
    ]
    .into_iter()
    .map(|(p, tiles)| {
        let o = CompactGpuOptions {
            gpu_layout: Some(tiles),
            ..Default::default()
        };
        (p, tiles, o)
    })
    .collect()
}

/// A well-conditioned tall system [K; stencil] (rows of 8 random entries, no dominant row, and
/// norm damping): LSQR converges in a few dozen iterations and rounding is not amplified.
fn tall_system(seed: u64) -> (Csr, Stencil, Vec<f64>) {
    let st = Stencil {
        n: [10, 7, 10],
        norm: 0.3,
        first: [0.5, 0.5, 0.5],
        second: [0.0; 3],
    };
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..3000u64 {
        for _ in 0..8 {
            r.push(i);
            c.push(rng.below(st.ncells() as u64));
            v.push(rng.uniform() * 2.0 - 1.0);
        }
    }
    let k = Csr::from_triplets(3000, st.ncells(), &r, &c, &v).unwrap();
    let b = rand_vec(3000 + st.nrows(), seed + 1);
    (k, st, b)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn device_loop_matches_host_loop_and_stops_exactly() {
    let g = gpu();
    let (k, st, b) = tall_system(40);
    let sop = StencilOp::new(st, Some(random_perm(st.ncells(), 41)));
    for (p, tiles, o) in layouts() {
        let op = CudaCompactOperator::with_options(&g, &k, Some(&sop), p, &o).unwrap();
        // the system converges (istop 5) at about iteration 42: 20 stops on the limit
        for (iter_lim, tol) in [(Some(20usize), 0.0), (None, 1e-10)] {
            let params = LsqrParams {
                damp: 0.05,
                atol: tol,
                btol: tol,
                conlim: 0.0,
                iter_lim,
                calc_var: true,
            };
            // the host loop, then the device loop, each with its history
            let [(host, hh), (dev, hd)] = [false, true].map(|device| {
                op.set_device_loop(device);
                let mut h = History::default();
                let p = LeastSquares::new(&g, &op, &SerialComm, &b);
                (lsqr(&p, &params, &mut h).unwrap(), h)
            });
            let again = common::serial_lsqr(&g, &op, &b, &params);
            let ex = rel(&dev.x, &host.x);
            let ev = rel(dev.var.as_ref().unwrap(), host.var.as_ref().unwrap());
            println!(
                "{p} layout {tiles:?} iter_lim {iter_lim:?}: host istop {} itn {} r1 {:.12e}; device istop {} itn {} r1 {:.12e}; x {ex:.2e} var {ev:.2e}",
                host.info.istop, host.info.itn, host.info.norms.r1norm, dev.info.istop, dev.info.itn, dev.info.norms.r1norm
            );
            assert_eq!(dev.info.istop, host.info.istop);
            assert_eq!(dev.info.itn, host.info.itn);
            assert!(ex <= 1e-10 && ev <= 1e-8, "x {ex:.2e} var {ev:.2e}");
            assert!(
                (dev.info.norms.r1norm - host.info.norms.r1norm).abs()
                    <= 1e-10 * host.info.norms.r1norm
            );
            // one record per iteration, in order, as the host loop gives them
            assert_eq!(hd.0.len(), hh.0.len());
            for (i, (d, h)) in hd.0.iter().zip(&hh.0).enumerate() {
                assert_eq!(d.itn, i);
                assert!((d.r1norm - h.r1norm).abs() <= 1e-9 * h.r1norm.abs().max(1e-300));
            }
            assert!(
                again
                    .x
                    .iter()
                    .zip(&dev.x)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "device loop not reproducible"
            );
            if iter_lim == Some(20) {
                assert_eq!(dev.info.istop, 7);
                assert_eq!(dev.info.itn, 20);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn device_loop_resume_from_a_checkpoint_is_bitwise_identical() {
    let g = gpu();
    let (k, st, b) = tall_system(50);
    let sop = StencilOp::new(st, None);
    let op = CudaCompactOperator::new(&g, &k, Some(&sop), Precision::F64).unwrap();
    op.set_device_loop(true);
    let params = LsqrParams {
        damp: 0.0,
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        iter_lim: Some(36),
        calc_var: false,
    };
    let bd = g.upload(&b).unwrap();
    let run = |at: usize| {
        let (mut s, mut v) = lsqr_start(&g, &op, &SerialComm, &bd, None, &params).unwrap();
        let mut mon = Keep {
            at,
            every: 10,
            hist: Vec::new(),
            saved: None,
        };
        lsqr_iterate(&g, &op, &SerialComm, &params, &mut s, &mut v, &mut mon).unwrap();
        (down(&g, &v.x), mon)
    };
    // (the system converges at about iteration 42: stop on the limit before it)
    let (x_full, mon) = run(20);
    let (s40, [u, v, w, x]) = mon.saved.expect("state at iteration 20");
    let mut vecs = LsqrVectors {
        u: g.upload(&u).unwrap(),
        v: g.upload(&v).unwrap(),
        w: g.upload(&w).unwrap(),
        x: g.upload(&x).unwrap(),
        var: None,
    };
    let mut s = s40;
    let mut mon2 = Keep {
        at: 0,
        every: 10,
        hist: Vec::new(),
        saved: None,
    };
    lsqr_iterate(&g, &op, &SerialComm, &params, &mut s, &mut vecs, &mut mon2).unwrap();
    let x_res = down(&g, &vecs.x);
    assert_eq!(s.itn, 36);
    assert!(
        x_res
            .iter()
            .zip(&x_full)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "resumed x differs by {:.2e}",
        rel(&x_res, &x_full)
    );
    println!("resume at 40 of 70: bitwise identical");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn compact_and_csr_device_loops_on_real_systems_match_cpu() {
    let (g, systems) = (gpu(), real_systems());
    for (name, sys, params) in systems {
        let cop = CpuCompactOperator::new(&sys.a, None, Precision::F64);
        let cs = common::cpu_lsqr(&cop, &sys.b, None, &params);
        let csr = CudaCsrOperator::new(&g, &sys.a, TransposeStrategy::Csc, Precision::F64).unwrap();
        csr.set_device_loop(true);
        let gs = common::serial_lsqr(&g, &csr, &sys.b, &params);
        for (p, tiles, o) in layouts() {
            let op = CudaCompactOperator::with_options(&g, &sys.a, None, p, &o).unwrap();
            op.set_device_loop(true);
            let ds = common::serial_lsqr(&g, &op, &sys.b, &params);
            let e = rel(&ds.x, &cs.x);
            println!(
                "{name} compact {p} layout {tiles:?}: istop {} itn {} r1norm {:.10e} x vs cpu {e:.2e} | csr device loop: istop {} itn {} x vs cpu {:.2e} | cpu istop {} itn {}",
                ds.info.istop, ds.info.itn, ds.info.norms.r1norm, gs.info.istop, gs.info.itn,
                rel(&gs.x, &cs.x), cs.info.istop, cs.info.itn
            );
            assert_eq!(ds.info.istop, cs.info.istop);
            assert!((ds.info.itn as f64 - cs.info.itn as f64).abs() <= 0.02 * cs.info.itn as f64);
            if p == Precision::F64 {
                assert!(e <= 1e-6, "{name}: {e}");
            }
        }
        assert_eq!(gs.info.istop, cs.info.istop);
        assert!(rel(&gs.x, &cs.x) <= 1e-6);
    }
}

/// The split layout's encoding made ahead (`seistomo prepare` keeps it) uploads to the operator
/// the rows would have made: the same products and the same LSQR solution bit for bit, f64 and
/// f32, with the stencil; an encoding of another precision is refused.
/// Two operators that must be one: the same products (random x and y) and the same LSQR
/// iterates (`params`, random b) bit for bit. Returns LSQR's iterations.
fn assert_same_operator(
    g: &CudaBackend,
    (one, other): (&CudaCompactOperator, &CudaCompactOperator),
    params: &LsqrParams,
    what: &str,
) -> usize {
    assert_eq!(one.layout(), other.layout(), "{what}");
    let x = rand_vec(one.ncols(), 62);
    let y = rand_vec(one.nrows(), 63);
    let (xd, yd) = (g.upload(&x).unwrap(), g.upload(&y).unwrap());
    let prods = |op: &CudaCompactOperator| {
        let (mut ax, mut aty) = (g.zeros(y.len()).unwrap(), g.zeros(x.len()).unwrap());
        op.apply(g, Scale::SET, &xd, &mut ax).unwrap();
        op.apply_t(g, Scale::SET, &yd, &mut aty).unwrap();
        (down(g, &ax), down(g, &aty))
    };
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (p1, p2) = (prods(one), prods(other));
    assert!(
        bits(&p1.0) == bits(&p2.0) && bits(&p1.1) == bits(&p2.1),
        "{what}: products"
    );
    let b = rand_vec(one.nrows(), 73);
    let (s1, s2) = (
        common::serial_lsqr(g, one, &b, params),
        common::serial_lsqr(g, other, &b, params),
    );
    assert_eq!((s1.info.istop, s1.info.itn), (s2.info.istop, s2.info.itn));
    assert!(bits(&s1.x) == bits(&s2.x), "{what}: LSQR's x");
    s2.info.itn
}

/// `m` rays of 100 cells each in 300,000 columns, clustered as a ray's cells are (100 m
/// nonzeros).
fn rays(m: u64, seed: u64) -> Csr {
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        let start = rng.below(290_000);
        for k in 0..100 {
            r.push(i);
            c.push(start + 97 * k + rng.below(90));
            v.push(rng.uniform() - 0.5);
        }
    }
    Csr::from_triplets(m as usize, 300_000, &r, &c, &v).unwrap()
}

/// A random permutation of 0..n as row numbers.
fn random_rows(n: usize, seed: u64) -> Vec<usize> {
    random_perm(n, seed)
        .into_iter()
        .map(|i| i as usize)
        .collect()
}

/// The GPU reorders rows and renames columns (src/grid/reorder.rs's ordering, before it encodes
/// them) into the matrix the host's `Csr::permuted` makes, on every shape, with and without a
/// column permutation.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn the_gpu_reorders_the_rows_the_host_does() {
    use seistomo::backend::cuda::permute_on_gpu;
    let g = gpu();
    let mut mats = awkward();
    mats.push(rays(20_000, 65));
    for (mi, a) in mats.iter().enumerate() {
        let rows = random_rows(a.nrows(), 70 + mi as u64);
        let cols = random_perm(a.ncols(), 80 + mi as u64);
        for cols in [Some(&cols[..]), None] {
            let want = a.clone().permuted(Some(&rows), cols);
            let got = permute_on_gpu(&g, a, &rows, cols).unwrap();
            assert!(
                got == want,
                "#{mi} {}x{} columns renamed: {}",
                a.nrows(),
                a.ncols(),
                cols.is_some()
            );
        }
        println!(
            "#{mi} {}x{}: reordered as the host does",
            a.nrows(),
            a.ncols()
        );
    }
}

/// The operator of rows reordered and encoded on the GPU (a fresh run's default) is the one made
/// from the rows reordered on the host: the same products and LSQR iterates, bit for bit; where
/// it would get another layout the GPU leaves it to the host.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn rows_reordered_on_the_gpu_give_the_hosts_operator() {
    use seistomo::backend::storage::ReorderedRows;
    use seistomo::grid::reorder::Ordering;
    let g = gpu();
    let params = LsqrParams {
        damp: 0.05,
        atol: 1e-10,
        btol: 1e-10,
        conlim: 0.0,
        iter_lim: Some(25),
        calc_var: false,
    };
    let (k, st, _) = tall_system(66);
    let big = rays(20_000, 67);
    let renamed = |a: &Csr| Some(random_perm(a.ncols(), 69));
    // the split layout asked for; auto on rays whose cells stay together (split) and on rays
    // whose cells are scattered by the renaming (rows: left to the host)
    for (a, layout, cols, split) in [
        (&k, Some(GpuLayout::Split), renamed(&k), true),
        (&big, None, None, true),
        (&big, None, renamed(&big), false),
    ] {
        let ordering = Ordering {
            rows: Some(random_rows(a.nrows(), 68)),
            cols,
            what: String::new(),
        };
        let sop = stencil_for(a.ncols())
            .filter(|_| a.ncols() == st.ncells())
            .map(|s| StencilOp::new(s, ordering.cols.clone()));
        let host = a
            .clone()
            .permuted(ordering.rows.as_deref(), ordering.cols.as_deref());
        let r = ReorderedRows {
            rows: std::sync::Arc::new(a.clone()),
            ordering,
            coverage_rows: None,
        };
        let o = CompactGpuOptions {
            gpu_layout: layout,
            ..Default::default()
        };
        for p in [Precision::F64, Precision::F32] {
            let made = CudaCompactOperator::with_options(&g, &host, sop.as_ref(), p, &o).unwrap();
            let mut uploads = 0;
            let dev = CudaCompactOperator::from_reordered(&g, &r, sop.as_ref(), p, &o, &mut || {
                uploads += 1
            })
            .unwrap();
            // told of the upload once where the GPU made the operator
            assert!(dev.is_none() || uploads == 1, "{uploads} uploads");
            assert_eq!(
                made.layout().starts_with("split"),
                split,
                "{}",
                made.layout()
            );
            let Some(dev) = dev else {
                assert!(
                    !split,
                    "{p} {layout:?}: the GPU left a split layout to the host"
                );
                println!(
                    "{} x {} {p}: {}, left to the host",
                    a.nrows(),
                    a.ncols(),
                    made.layout()
                );
                continue;
            };
            assert!(
                split,
                "{p}: the GPU made what the host makes in {}",
                made.layout()
            );
            assert_same_operator(&g, (&made, &dev), &params, &format!("{p} {layout:?}"));
            println!(
                "{} x {} {p} {}: reordered on the GPU = on the host, bit for bit",
                a.nrows(),
                a.ncols(),
                dev.layout()
            );
        }
        // another layout asked for: left to the host
        let rows_layout = CompactGpuOptions {
            gpu_layout: Some(GpuLayout::Rows),
            ..Default::default()
        };
        let none = CudaCompactOperator::from_reordered(
            &g,
            &r,
            sop.as_ref(),
            Precision::F64,
            &rows_layout,
            &mut || {},
        )
        .unwrap();
        assert!(none.is_none());
    }
}

/// The tiles the GPU encodes from uploaded rows (the default of a fresh run, `gpu_encode`) are
/// the CPU's, array for array: every half, precision and tile size from 1 to 15 bits, on the
/// awkward shapes, a tile hit by more rows than a chunk holds, and a system large enough for
/// the sorts' blocks and passes to matter.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn the_gpu_encodes_the_tiles_the_cpu_does() {
    use seistomo::backend::cuda::encode_on_gpu;
    use seistomo::sparse::tiled::{Tiled, TiledHalf};
    let g = gpu();
    let mut mats = awkward();
    // 5000 rows in columns 3 and 9: one tile of 3 chunks at small tile sizes
    let r: Vec<u64> = (0..10_000u64).map(|i| i / 2).collect();
    let c: Vec<u64> = (0..10_000u64)
        .map(|i| if i % 2 == 0 { 3 } else { 9 })
        .collect();
    let v: Vec<f64> = (0..10_000).map(|i| 1.0 + i as f64 / 7.0).collect();
    mats.push(Csr::from_triplets(5000, 12, &r, &c, &v).unwrap());
    mats.push(awkward_csr(60_000, 400_000, 17));
    mats.push(rays(20_000, 64));
    for (mi, a) in mats.iter().enumerate() {
        for bits in [1u32, 4, 9, 12, 15] {
            for p in [Precision::F64, Precision::F32] {
                for half in [TiledHalf::Rows, TiledHalf::Cols] {
                    let want = Tiled::from_csr_half(a, p, bits, half);
                    let got = encode_on_gpu(&g, a, p, bits, half).unwrap();
                    let what = format!("#{mi} {}x{} {p} 2^{bits} {half:?}", a.nrows(), a.ncols());
                    assert_eq!(got.check(), Ok(()), "{what}");
                    assert_eq!(
                        (&got.chunk_tile, &got.chunk_seg, &got.tile_chunk),
                        (&want.chunk_tile, &want.chunk_seg, &want.tile_chunk),
                        "{what}: chunks"
                    );
                    assert_eq!(
                        (&got.seg_row, &got.seg_slot, &got.seg_pos),
                        (&want.seg_row, &want.seg_slot, &want.seg_pos),
                        "{what}: segments"
                    );
                    assert_eq!(
                        (&got.seg_ent, &got.row_seg),
                        (&want.seg_ent, &want.row_seg),
                        "{what}: offsets"
                    );
                    assert!(got == want, "{what}: entries");
                }
            }
        }
        println!(
            "#{mi} {}x{}: the GPU's tiles are the CPU's",
            a.nrows(),
            a.ncols()
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn an_encoding_made_ahead_uploads_to_the_same_operator() {
    use seistomo::backend::cuda::encode_ahead;
    use seistomo::backend::storage::EncodedRows;
    use std::sync::Arc;
    let g = gpu();
    let (k, st, _) = tall_system(60);
    let sop = StencilOp::new(st, Some(random_perm(st.ncells(), 61)));
    let o = CompactGpuOptions {
        gpu_layout: Some(GpuLayout::Split),
        ..Default::default()
    };
    let params = LsqrParams {
        damp: 0.05,
        atol: 1e-10,
        btol: 1e-10,
        conlim: 0.0,
        iter_lim: Some(30),
        calc_var: false,
    };
    for p in [Precision::F64, Precision::F32] {
        let enc = encode_ahead(&k, p, &o).expect("split asked for");
        let kc = k.clone();
        let rows = EncodedRows {
            nrows: k.nrows(),
            ncols: k.ncols(),
            nnz: k.nnz(),
            encoding: Arc::new(enc),
            described: String::new(),
            csr: Arc::new(move || Ok(kc.clone())),
        };
        let made = CudaCompactOperator::with_options(&g, &k, Some(&sop), p, &o).unwrap();
        let ahead = CudaCompactOperator::from_encoded(&g, &rows, Some(&sop), p, &o).unwrap();
        for op in [&made, &ahead] {
            op.set_device_loop(true);
        }
        let itn = assert_same_operator(&g, (&made, &ahead), &params, &format!("{p}"));
        println!("{p}: made ahead = made now, bit for bit ({itn} iterations)");
        // asked for the other precision: refused (the run encodes the rows instead)
        let other = if p == Precision::F64 {
            Precision::F32
        } else {
            Precision::F64
        };
        let e = CudaCompactOperator::from_encoded(&g, &rows, Some(&sop), other, &o)
            .err()
            .expect("another precision is refused")
            .to_string();
        assert!(e.contains("not what this run asks for"), "{e}");
    }
}

/// `seistomo prepare` keeps the stored rows, which the next `invert` uploads for the GPU to
/// encode (a `gpu_encode` phase, no `encode`); with `gpu_encode = false` it keeps the
/// encoding, which the run uploads as it is (neither phase). Both write the fresh run's
/// solution bit for bit.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where there is one (bench/gpu.sh tests)"]
fn a_prepared_invert_gives_the_fresh_solution_from_the_rows_or_the_kept_encoding() {
    let bin = common::seistomo_path();
    let dir = std::env::temp_dir().join(format!("seistomo-gpu-prep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(&bin)
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{text}");
        text
    };
    let ds = dir.join("ds");
    run(&[
        "-q".as_ref(),
        "synth".as_ref(),
        "-o".as_ref(),
        ds.as_os_str(),
        "--grid".as_ref(),
        "24,24,16".as_ref(),
        "--rays".as_ref(),
        "6000".as_ref(),
        "--norm-damping".as_ref(),
        "0.1".as_ref(),
        "--flattening".as_ref(),
        "0.5,0.5,0.5".as_ref(),
    ]);
    for (name, precision) in [("f64", "f64"), ("f32", "f32")] {
        let out = dir.join(format!("out-{name}"));
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[dataset]\npath = \"{}\"\n[solver]\niter_lim = 80\n[backend]\nkind = \"cuda\"\nstorage = \"compact\"\nprecision = \"{precision}\"\n[tuning]\ngpu_layout = \"split\"\n[output]\ndir = \"{}\"\n",
                ds.join("dataset.toml").display(),
                out.display()
            ),
        )
        .unwrap();
        // the solution file, report.json, and the coverage in model.h5 (hit count, DWS bits)
        let invert_with = |extra: &[&std::ffi::OsStr]| {
            let _ = std::fs::remove_dir_all(&out);
            let mut args: Vec<&std::ffi::OsStr> = vec!["-q".as_ref(), "invert".as_ref()];
            args.extend_from_slice(extra);
            args.push(cfg.as_os_str());
            run(&args);
            let r: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
            let f = hdf5::File::open(out.join("model.h5")).unwrap();
            let hits: Vec<u32> = f.dataset("model/hit_count").unwrap().read_raw().unwrap();
            let dws: Vec<f64> = f.dataset("model/dws").unwrap().read_raw().unwrap();
            let dws: Vec<u64> = dws.iter().map(|v| v.to_bits()).collect();
            (
                std::fs::read(out.join("solution.txt")).unwrap(),
                r,
                (hits, dws),
            )
        };
        let invert = || invert_with(&[]);
        let _ = std::fs::remove_dir_all(ds.join("prepared"));
        // the rows reordered and encoded on the CPU, the coverage computed before the set-up
        let (on_cpu, rc, cov_cpu) = invert_with(&["--tune".as_ref(), "gpu_encode=false".as_ref()]);
        assert!(rc["setup_phases"].get("encode").is_some(), "{name}");
        let (fresh, rf, cov_fresh) = invert();
        // the coverage computed from the rows as read while the GPU solved: the same bits
        assert!(cov_fresh == cov_cpu, "{name}: the coverage differs");
        // a layout the GPU does not encode from the rows as read (they are reordered on the
        // host): the coverage taken from them first, the same bits
        for layout in ["gpu_layout=tiles", "gpu_layout=rows"] {
            let (_, rt, cov) = invert_with(&["--tune".as_ref(), layout.as_ref()]);
            assert!(cov == cov_cpu, "{name} {layout}: the coverage differs");
            assert!(
                rt["setup_phases"].get("gpu_encode").is_none(),
                "{name} {layout}"
            );
        }
        // scaled columns (`col_scale`: the rows reordered on the host for the scaling): the
        // same coverage
        let text = std::fs::read_to_string(&cfg).unwrap();
        let scaled = text.replace("[solver]\n", "[solver]\ncol_scale = true\n");
        assert_ne!(scaled, text, "{name}: no [solver] table to scale in");
        std::fs::write(&cfg, scaled).unwrap();
        let (_, _, cov_scaled) = invert();
        std::fs::write(&cfg, text).unwrap();
        assert!(
            cov_scaled == cov_cpu,
            "{name} col_scale: the coverage differs"
        );
        assert!(
            on_cpu == fresh,
            "{name}: gpu_encode = false's solution differs"
        );
        // a fresh run encodes on the GPU (the default, `gpu_encode`)
        assert!(
            rf["setup_phases"].get("gpu_encode").is_some()
                && rf["setup_phases"].get("encode").is_none(),
            "{name}: {}",
            rf["setup_phases"]
        );
        // `prepare` by default: the stored rows, which the run uploads and the GPU encodes
        let said = run(&["prepare".as_ref(), cfg.as_os_str()]);
        assert!(!said.contains("encoded for the GPU"), "{name}: {said}");
        let (again, ra, cov_again) = invert();
        assert!(
            cov_again == cov_cpu,
            "{name}: the prepared run's coverage differs"
        );
        let note = ra["prepared"].as_str().unwrap_or_default();
        assert!(note.starts_with("used "), "{name}: {note}");
        assert!(
            ra["setup_phases"].get("encode").is_none()
                && ra["setup_phases"].get("gpu_encode").is_some(),
            "{name}: {}",
            ra["setup_phases"]
        );
        assert!(
            fresh == again,
            "{name}: the prepared run's solution differs"
        );
        // `gpu_encode = false`: `prepare` keeps the encoding and the run uploads it as it is
        let text = std::fs::read_to_string(&cfg).unwrap();
        let kept = text.replace("[tuning]\n", "[tuning]\ngpu_encode = false\n");
        assert_ne!(kept, text, "{name}: no [tuning] table");
        std::fs::write(&cfg, kept).unwrap();
        let said = run(&["prepare".as_ref(), cfg.as_os_str()]);
        assert!(said.contains("encoded for the GPU"), "{name}: {said}");
        let (again, ra, cov_again) = invert();
        std::fs::write(&cfg, text).unwrap();
        assert!(
            cov_again == cov_cpu,
            "{name}: the prepared run's coverage differs (encoding kept)"
        );
        let note = ra["prepared"].as_str().unwrap_or_default();
        assert!(note.starts_with("used "), "{name}: {note}");
        assert!(
            ra["setup_phases"].get("encode").is_none()
                && ra["setup_phases"].get("gpu_encode").is_none(),
            "{name}: {}",
            ra["setup_phases"]
        );
        // the same storage; its words come from the host's encoding in the prepared file and
        // from the GPU's in the fresh run
        let words = |r: &serde_json::Value| {
            let s = r["storage"].as_str().unwrap_or_default().to_string();
            let kind = s.split(',').next().unwrap_or_default().to_string();
            let stencil = s.split(" + ").nth(1).unwrap_or_default().to_string();
            (kind, stencil)
        };
        assert_eq!(
            words(&rf),
            words(&ra),
            "{name}: {} / {}",
            rf["storage"],
            ra["storage"]
        );
        assert!(
            words(&rf).1.starts_with("stencil damping"),
            "{name}: {}",
            rf["storage"]
        );
        assert_eq!(rf["transpose"], ra["transpose"], "{name}");
        assert!(
            fresh == again,
            "{name}: the prepared run's solution differs (encoding kept)"
        );
        println!(
            "{name}: prepared run bit for bit; setup {} s fresh, {} s prepared",
            rf["seconds"]["setup"], ra["seconds"]["setup"]
        );
    }
}
