//! The parallel set-up (src/sparse/par.rs and its users) against the plain sequential versions
//! it replaced, bit for bit: transposes, row gathers and permutations, orderings, compact and
//! tiled encodings, gap histograms, coverage, the stencil split and the CPU operators' stored
//! matrices, on random and synthetic inputs and on pools of 1 to 4 threads.

use seistomo::backend::cpu::CpuCompactOperator;
use seistomo::backend::storage::{prepare, Storage};
use seistomo::grid::reorder::{morton_order, Ordering, Reorder};
use seistomo::grid::synthetic::straight_ray_kernel;
use seistomo::grid::{regularisation, Coverage, Grid, Stencil};
use seistomo::sparse::tiled::{Tiled, TiledHalf, TiledValues};
use seistomo::sparse::{
    CompactCsr, CompactValues, Csr, GapHistogram, Precision, RowSort, TripletPart,
};
use seistomo::testproblems::awkward_csr;

mod reference {
    //! The sequential code as it was (commit a475c34), for comparison.
    use super::*;

    /// A^T through the triplets (j, i, a_ij), which from_triplets sorts by row and column:
    /// what the counting sort of a475c34 gave, by another road.
    pub fn transpose(a: &Csr) -> Csr {
        let (mut rows, mut cols, mut vals) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..a.nrows() {
            let (c, v) = a.row(i);
            for (&j, &x) in c.iter().zip(v) {
                rows.push(j as u64);
                cols.push(i as u64);
                vals.push(x);
            }
        }
        Csr::from_triplets(a.ncols(), a.nrows(), &rows, &cols, &vals).unwrap()
    }

    pub fn select_rows(a: &Csr, rows: &[usize]) -> Csr {
        let mut indptr = vec![0u64];
        let (mut indices, mut data) = (Vec::new(), Vec::new());
        for &r in rows {
            let (c, v) = a.row(r);
            indices.extend_from_slice(c);
            data.extend_from_slice(v);
            indptr.push(indices.len() as u64);
        }
        Csr::try_new(rows.len(), a.ncols(), indptr, indices, data).unwrap()
    }

    pub fn permute_columns(a: &Csr, new_of_old: &[u32]) -> Csr {
        let mut indices = Vec::with_capacity(a.nnz());
        let mut data = Vec::with_capacity(a.nnz());
        let mut pairs: Vec<(u32, f64)> = Vec::new();
        for i in 0..a.nrows() {
            let (c, v) = a.row(i);
            pairs.clear();
            pairs.extend(c.iter().zip(v).map(|(&j, &x)| (new_of_old[j as usize], x)));
            pairs.sort_unstable_by_key(|p| p.0);
            for &(j, x) in &pairs {
                indices.push(j);
                data.push(x);
            }
        }
        Csr::try_new(a.nrows(), a.ncols(), a.indptr().to_vec(), indices, data).unwrap()
    }

    /// a's bits in the odd places, b's in the even ones (bit by bit: another way than the
    /// library's mask cascade to the same key).
    fn interleave2(a: u32, b: u32) -> u64 {
        (0..32).fold(0u64, |key, bit| {
            key | ((a as u64 >> bit) & 1) << (2 * bit + 1) | ((b as u64 >> bit) & 1) << (2 * bit)
        })
    }

    pub fn morton(nx: usize, ny: usize, nz: usize) -> Vec<u32> {
        // i's bits at 3b, j's at 3b + 1, k's at 3b + 2, bit by bit over the 21 bits a u64 holds
        let key = |i: usize, j: usize, k: usize| -> u64 {
            (0..21).fold(0u64, |key, bit| {
                key | ((i as u64 >> bit) & 1) << (3 * bit)
                    | ((j as u64 >> bit) & 1) << (3 * bit + 1)
                    | ((k as u64 >> bit) & 1) << (3 * bit + 2)
            })
        };
        let n = nx * ny * nz;
        let mut keyed: Vec<(u64, u32)> = (0..n)
            .map(|c| (key(c % nx, (c / nx) % ny, c / (nx * ny)), c as u32))
            .collect();
        keyed.sort_unstable();
        let mut new_of_old = vec![0u32; n];
        for (new, &(_, old)) in keyed.iter().enumerate() {
            new_of_old[old as usize] = new as u32;
        }
        new_of_old
    }

    /// Ordering::plan's row order.
    pub fn row_order(a: &Csr, cols: Option<&[u32]>) -> Vec<usize> {
        // the smallest and largest new column of the row (0, 0 for an empty row), interleaved
        let key = |i: usize| -> u64 {
            let (c, _) = a.row(i);
            let new: Vec<u32> = c
                .iter()
                .map(|&j| cols.map_or(j, |p| p[j as usize]))
                .collect();
            let lo = new.iter().min().copied().unwrap_or(0);
            let hi = new.iter().max().copied().unwrap_or(0);
            interleave2(lo, hi)
        };
        let keys: Vec<u64> = (0..a.nrows()).map(key).collect();
        let mut order: Vec<usize> = (0..a.nrows()).collect();
        order.sort_by_key(|&i| keys[i]);
        order
    }

    pub fn compact(a: &Csr, precision: Precision) -> (Vec<u64>, Vec<u32>, Vec<u16>, Vec<f64>) {
        let (ip, ci, va) = (a.indptr(), a.indices(), a.data());
        let (mut ptr, mut base, mut delta, mut vals) = (vec![0u64], vec![], vec![], vec![]);
        for r in 0..a.nrows() {
            let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
            base.push(if s < e { ci[s] } else { 0 });
            for k in s..e {
                let mut gap = if k == s { 0 } else { ci[k] - ci[k - 1] };
                while gap > 65535 {
                    delta.push(65535u16);
                    vals.push(0.0);
                    gap -= 65535;
                }
                let v = if gap == 65535 && va[k] == 0.0 {
                    -0.0
                } else {
                    va[k]
                };
                delta.push(gap as u16);
                vals.push(match precision {
                    Precision::F64 => v,
                    Precision::F32 => v as f32 as f64,
                });
            }
            ptr.push(delta.len() as u64);
        }
        (ptr, base, delta, vals)
    }

    pub fn gaps(a: &Csr) -> ([u64; 17], u64, u64) {
        let (ip, ci) = (a.indptr(), a.indices());
        let (mut counts, mut fillers, mut steps) = ([0u64; 17], 0u64, 0u64);
        for r in 0..a.nrows() {
            for k in ip[r] as usize + 1..ip[r + 1] as usize {
                let g = ci[k] - ci[k - 1];
                counts[(31 - g.leading_zeros()).min(16) as usize] += 1;
                fillers += ((g.max(1) - 1) / 65535) as u64;
                steps += 1;
            }
        }
        (counts, fillers, steps)
    }

    pub fn coverage(a: &Csr, kernel_rows: usize) -> (Vec<u32>, Vec<f64>) {
        let n = a.ncols();
        let (mut hit_count, mut dws) = (vec![0u32; n], vec![0.0; n]);
        for i in 0..kernel_rows.min(a.nrows()) {
            let (cols, vals) = a.row(i);
            for (&c, &v) in cols.iter().zip(vals) {
                if v != 0.0 {
                    hit_count[c as usize] = hit_count[c as usize].saturating_add(1);
                    dws[c as usize] += v.abs();
                }
            }
        }
        (hit_count, dws)
    }

    /// Tiled::from_csr (both halves) as it was: (segments, chunks, row entries, column
    /// entries) in one tuple of arrays.
    #[allow(clippy::type_complexity)]
    pub fn tiled(
        a: &Csr,
        tile_bits: u32,
    ) -> (
        Vec<u64>,
        Vec<u32>,
        Vec<u32>,
        Vec<u32>,
        Vec<u64>,
        Vec<u16>,
        Vec<f64>,
        Vec<u64>,
        Vec<u16>,
        Vec<f64>,
    ) {
        let (m, n) = a.shape();
        let (ip, ci, va) = (a.indptr(), a.indices(), a.data());
        let ntiles = n.div_ceil(1 << tile_bits).max(1);
        let t_of = |c: u32| c >> tile_bits;
        let opens = |s: usize, j: usize| j == s || t_of(ci[j]) != t_of(ci[j - 1]);
        let mut row_seg = vec![0u64];
        for r in 0..m {
            let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
            let k = (s..e).filter(|&j| opens(s, j)).count() as u64;
            row_seg.push(row_seg.last().unwrap() + k);
        }
        let nseg = *row_seg.last().unwrap() as usize;
        let mut tile_count = vec![0u64; ntiles + 1];
        for r in 0..m {
            let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
            for j in s..e {
                if opens(s, j) {
                    tile_count[t_of(ci[j]) as usize + 1] += 1;
                }
            }
        }
        for t in 0..ntiles {
            tile_count[t + 1] += tile_count[t];
        }
        let tile_seg = tile_count;
        // every segment (a row's run of entries in one tile) as (tile, row, slot, start, len),
        // then a stable sort by tile: what a475c34's counting sort placed, by another road
        let mut segs: Vec<(u32, u32, u32, usize, usize)> = Vec::with_capacity(nseg);
        for r in 0..m {
            let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
            let mut j = s;
            while j < e {
                let t = t_of(ci[j]);
                let j1 = (j + 1..e).find(|&q| t_of(ci[q]) != t).unwrap_or(e);
                let slot =
                    row_seg[r] as usize + segs.iter().rev().take_while(|g| g.1 == r as u32).count();
                segs.push((t, r as u32, slot as u32, j, j1 - j));
                j = j1;
            }
        }
        segs.sort_by_key(|g| g.0);
        let row: Vec<u32> = segs.iter().map(|g| g.1).collect();
        let slot: Vec<u32> = segs.iter().map(|g| g.2).collect();
        let csr: Vec<(usize, usize)> = segs.iter().map(|g| (g.3, g.4)).collect();
        let mut chunk_seg = Vec::new();
        for t in 0..ntiles {
            let (s0, s1) = (tile_seg[t] as usize, tile_seg[t + 1] as usize);
            let mut s = s0;
            loop {
                chunk_seg.push(s as u32);
                s = (s + 2048).min(s1);
                if s >= s1 {
                    break;
                }
            }
        }
        chunk_seg.push(nseg as u32);
        let mut seg_ent = vec![0u64];
        let (mut a_lcol, mut a_val) = (Vec::new(), Vec::new());
        for &(st, len) in &csr {
            for j in st..st + len {
                a_lcol.push((ci[j] & ((1 << tile_bits) - 1)) as u16);
                a_val.push(va[j]);
            }
            seg_ent.push(a_lcol.len() as u64);
        }
        let tsz = 1usize << tile_bits;
        let nchunks = chunk_seg.len() - 1;
        let mut b_colptr = vec![0u64; nchunks * tsz + 1];
        let (mut b_lseg, mut b_val) = (vec![0u16; a.nnz()], vec![0f64; a.nnz()]);
        for q in 0..nchunks {
            let (s0, s1) = (chunk_seg[q] as usize, chunk_seg[q + 1] as usize);
            let (a0, a1) = (seg_ent[s0] as usize, seg_ent[s1] as usize);
            let mut count = vec![0u64; tsz + 1];
            for &c in &a_lcol[a0..a1] {
                count[c as usize + 1] += 1;
            }
            for c in 0..tsz {
                count[c + 1] += count[c];
            }
            for c in 0..tsz {
                b_colptr[q * tsz + c] = a0 as u64 + count[c];
            }
            for s in s0..s1 {
                for k in seg_ent[s] as usize..seg_ent[s + 1] as usize {
                    let c = a_lcol[k] as usize;
                    let pos = a0 + count[c] as usize;
                    count[c] += 1;
                    b_lseg[pos] = (s - s0) as u16;
                    b_val[pos] = a_val[k];
                }
            }
        }
        b_colptr[nchunks * tsz] = a.nnz() as u64;
        for &e in &seg_ent[1..] {
            a_lcol[e as usize - 1] |= 0x8000;
        }
        (
            row_seg, row, slot, chunk_seg, seg_ent, a_lcol, a_val, b_colptr, b_lseg, b_val,
        )
    }
}

/// Run `f` on a pool of `threads` threads.
fn on<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// Inputs: random matrices of awkward structure (empty rows, a long row, untouched columns,
/// wide columns that need escapes) and a synthetic ray kernel with its grid damping.
fn inputs() -> Vec<(String, Csr, Option<[usize; 3]>, usize)> {
    let mut v = Vec::new();
    for &(m, n, seed) in &[
        (40_000usize, 3_000usize, 1u64),
        (5_000, 300_000, 2),
        (300, 200, 3),
        (70_000, 64, 4),
    ] {
        v.push((format!("awkward {m}x{n}"), awkward_csr(m, n, seed), None, m));
    }
    let g = Grid::new([32, 24, 20], [0.0; 3], [1.0; 3]);
    let k = straight_ray_kernel(&g, 6000, 7);
    let d = regularisation(&g, 0.1, [0.5; 3], [0.0; 3]);
    let rows = k.nrows();
    let a = k.vstack_scaled(&d, 1.0).unwrap();
    v.push(("synthetic 32x24x20".into(), a, Some(g.n), rows));
    v
}

#[test]
fn transposes_gathers_and_permutations_are_the_sequential_ones() {
    for (name, a, _, _) in inputs() {
        let t = reference::transpose(&a);
        let mut rng = seistomo::grid::Rng::new(11);
        let mut rows: Vec<usize> = (0..a.nrows()).collect();
        for i in (1..rows.len()).rev() {
            rows.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut cols: Vec<u32> = (0..a.ncols() as u32).collect();
        for i in (1..cols.len()).rev() {
            cols.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let sel = reference::select_rows(&a, &rows);
        let both = reference::permute_columns(&sel, &cols);
        let only_cols = reference::permute_columns(&a, &cols);
        for threads in [1, 3, 4] {
            on(threads, || {
                assert_eq!(a.transpose(), t, "{name}: transpose, {threads} threads");
                assert_eq!(t.transpose(), a, "{name}: transpose back");
                assert_eq!(a.select_rows(&rows), sel, "{name}: select_rows");
                assert_eq!(
                    a.permute_columns(&cols),
                    only_cols,
                    "{name}: permute_columns"
                );
                let p = a.clone().permuted(Some(&rows), Some(&cols));
                assert_eq!(p, both, "{name}: rows and columns");
                let p = a.clone().permuted(None, Some(&cols));
                assert_eq!(p, only_cols, "{name}: columns in place");
                assert_eq!(a.clone().permuted(Some(&rows), None), sel, "{name}: rows");
            });
        }
    }
}

#[test]
fn orderings_and_their_application_are_the_sequential_ones() {
    for (name, a, grid, _) in inputs() {
        let b: Vec<f64> = (0..a.nrows()).map(|i| i as f64 * 0.5).collect();
        let grid = grid.or(Some([a.ncols(), 1, 1]));
        let [nx, ny, nz] = grid.unwrap();
        let cols = reference::morton(nx, ny, nz);
        assert_eq!(morton_order(nx, ny, nz), cols, "{name}: morton");
        for (how, with_cols) in [(Reorder::Rows, false), (Reorder::Auto, true)] {
            let p = with_cols.then_some(&cols[..]);
            let rows = reference::row_order(&a, p);
            let want_b: Vec<f64> = rows.iter().map(|&i| b[i]).collect();
            let sel = reference::select_rows(&a, &rows);
            let want = match p {
                Some(p) => reference::permute_columns(&sel, p),
                None => sel,
            };
            for threads in [1, 2, 4] {
                on(threads, || {
                    let o = Ordering::plan(&a, how, grid);
                    assert_eq!(o.rows.as_deref(), Some(&rows[..]), "{name}: {how:?} rows");
                    assert_eq!(o.cols.as_deref(), p, "{name}: {how:?} columns");
                    let (a2, b2) = o.apply(a.clone(), b.clone());
                    assert_eq!(a2, want, "{name}: {how:?} applied");
                    assert_eq!(b2, want_b);
                });
            }
        }
    }
}

#[test]
fn encodings_histograms_and_coverage_are_the_sequential_ones() {
    for (name, a, _, kernel_rows) in inputs() {
        let (counts, fillers, steps) = reference::gaps(&a);
        let (hits, dws) = reference::coverage(&a, kernel_rows);
        let tiled = reference::tiled(&a, 9);
        for threads in [1, 2, 4] {
            on(threads, || {
                let h = GapHistogram::of(&a);
                assert_eq!(
                    (h.counts, h.fillers, h.steps),
                    (counts, fillers, steps),
                    "{name}"
                );
                let c = Coverage::from_kernel_rows(&a, kernel_rows);
                assert_eq!(c.hit_count, hits, "{name}: hit count");
                assert_eq!(
                    c.dws.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    dws.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{name}: dws"
                );
                for p in [Precision::F64, Precision::F32] {
                    let (ptr, base, delta, vals) = reference::compact(&a, p);
                    let c = CompactCsr::from_csr(&a, p);
                    assert_eq!(
                        (c.ptr(), c.base(), c.delta()),
                        (&ptr[..], &base[..], &delta[..])
                    );
                    let got: Vec<u64> = match c.values() {
                        CompactValues::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
                        CompactValues::F32(v) => v.iter().map(|&x| (x as f64).to_bits()).collect(),
                    };
                    let want: Vec<u64> = vals.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "{name}: compact {p} values");
                    // rows encoded in an order: the encoding of the reordered copy
                    let order: Vec<u32> = (0..a.nrows() as u32).rev().collect();
                    let rows: Vec<usize> = order.iter().map(|&r| r as usize).collect();
                    assert_eq!(
                        CompactCsr::from_rows(&a, Some(&order), p),
                        CompactCsr::from_csr(&reference::select_rows(&a, &rows), p),
                        "{name}: compact in order"
                    );
                    let t = Tiled::from_csr(&a, p, 9);
                    let f = |v: &[f64]| -> Vec<u64> {
                        v.iter()
                            .map(|&x| match p {
                                Precision::F64 => x.to_bits(),
                                Precision::F32 => (x as f32 as f64).to_bits(),
                            })
                            .collect()
                    };
                    let bits = |v: &TiledValues| -> Vec<u64> {
                        match v {
                            TiledValues::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
                            TiledValues::F32(v) => {
                                v.iter().map(|&x| (x as f64).to_bits()).collect()
                            }
                        }
                    };
                    let (
                        row_seg,
                        row,
                        slot,
                        chunk_seg,
                        seg_ent,
                        a_lcol,
                        a_val,
                        colptr,
                        lseg,
                        b_val,
                    ) = &tiled;
                    assert_eq!(&t.row_seg, row_seg, "{name}: row_seg");
                    assert_eq!(&t.seg_row, row, "{name}: seg_row");
                    assert_eq!(&t.seg_slot, slot, "{name}: seg_slot");
                    assert_eq!(&t.chunk_seg, chunk_seg, "{name}: chunk_seg");
                    assert_eq!(&t.seg_ent, seg_ent, "{name}: seg_ent");
                    assert_eq!(&t.a_lcol, a_lcol, "{name}: a_lcol");
                    assert_eq!(bits(&t.a_val), f(a_val), "{name}: a_val");
                    assert_eq!(&t.b_colptr, colptr, "{name}: b_colptr");
                    assert_eq!(&t.b_lseg, lseg, "{name}: b_lseg");
                    assert_eq!(bits(&t.b_val), f(b_val), "{name}: b_val");
                    for (s, &k) in t.seg_slot.iter().enumerate() {
                        assert_eq!(t.seg_pos[k as usize] as usize, s);
                    }
                    let rows_half = Tiled::from_csr_half(&a, p, 9, TiledHalf::Rows);
                    assert_eq!(rows_half.a_lcol, t.a_lcol);
                    assert!(rows_half.b_lseg.is_empty());
                    let cols_half = Tiled::from_csr_half(&a, p, 9, TiledHalf::Cols);
                    assert_eq!(
                        (&cols_half.b_colptr, &cols_half.b_lseg),
                        (&t.b_colptr, &t.b_lseg)
                    );
                    assert!(cols_half.a_lcol.is_empty());
                }
            });
        }
    }
}

#[test]
fn the_stencil_split_and_the_cpu_operators_store_the_sequential_matrices() {
    let (name, a, grid, kernel_rows) = inputs().pop().unwrap();
    let b: Vec<f64> = (0..a.nrows()).map(|i| (i % 13) as f64).collect();
    // the sequential split: the tail copied, the stencil found in it, the head copied
    let tail = reference::select_rows(&a, &(kernel_rows..a.nrows()).collect::<Vec<_>>());
    let (s, st) = Stencil::detect_suffix(&tail, grid.unwrap()).expect("the grid damping");
    let head = reference::select_rows(&a, &(0..kernel_rows + s).collect::<Vec<_>>());
    let o = Ordering::plan(&head, Reorder::Auto, grid);
    let want = reference::permute_columns(
        &reference::select_rows(&head, o.rows.as_ref().unwrap()),
        o.cols.as_ref().unwrap(),
    );
    let want_t = reference::transpose(&want);
    for threads in [1, 2, 4] {
        on(threads, || {
            let p = prepare(
                a.clone(),
                b.clone(),
                kernel_rows,
                grid,
                Storage::Compact,
                Reorder::Auto,
                true,
                Default::default(),
            );
            assert_eq!(p.matrix.rows.as_csr(), Some(&want), "{name}: prepared rows");
            assert_eq!(p.matrix.stencil.as_ref().unwrap().stencil(), &st);
            for sort in [RowSort::Auto, RowSort::Windows(64), RowSort::Keep] {
                let op = CpuCompactOperator::with_row_sort(&want, None, Precision::F64, sort);
                let (oa, ot) = op.order();
                let rows = |o: Option<&seistomo::sparse::RowOrder>, n: usize| {
                    o.map_or((0..n).collect(), |o| o.rows())
                };
                assert_eq!(
                    op.stored(),
                    &CompactCsr::from_csr(
                        &reference::select_rows(&want, &rows(oa, want.nrows())),
                        Precision::F64
                    )
                );
                assert_eq!(
                    op.transposed(),
                    &CompactCsr::from_csr(
                        &reference::select_rows(&want_t, &rows(ot, want_t.nrows())),
                        Precision::F64
                    )
                );
            }
        });
    }
}

#[test]
fn triplet_parts_build_what_from_triplets_builds() {
    let mut rng = seistomo::grid::Rng::new(5);
    let (m, n) = (3000usize, 2000usize);
    let mut t: Vec<(u32, u32, f64)> = (0..200_000)
        .map(|_| {
            let v = rng.uniform() * 2.0 - 1.0;
            (rng.below(m as u64) as u32, rng.below(n as u64) as u32, v)
        })
        .collect();
    // any order with repeats; then row-major and column-major without repeats
    let mut orders = vec![t.clone()];
    t.sort_by_key(|e| (e.0, e.1));
    t.dedup_by_key(|e| (e.0, e.1));
    orders.push(t.clone());
    t.sort_by_key(|e| (e.1, e.0));
    orders.push(t);
    for (k, t) in orders.iter().enumerate() {
        let rows: Vec<u64> = t.iter().map(|e| e.0 as u64).collect();
        let cols: Vec<u64> = t.iter().map(|e| e.1 as u64).collect();
        let vals: Vec<f64> = t.iter().map(|e| e.2).collect();
        let want = Csr::from_triplets(m, n, &rows, &cols, &vals).unwrap();
        for cut in [1usize, 7, 1000] {
            let parts: Vec<TripletPart> = t
                .chunks(t.len().div_ceil(cut))
                .map(|c| TripletPart {
                    rows: c.iter().map(|e| e.0).collect(),
                    cols: c.iter().map(|e| e.1).collect(),
                    vals: c.iter().map(|e| e.2).collect(),
                })
                .collect();
            for threads in [1, 3, 4] {
                let got = on(threads, || Csr::from_triplet_parts(m, n, parts.clone()));
                assert_eq!(got, want, "order {k}, {cut} parts, {threads} threads");
            }
        }
    }
}
