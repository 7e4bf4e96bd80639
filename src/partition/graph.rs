//! How the rows of a square system are split across ranks: contiguous blocks of equal row counts,
//! contiguous blocks of about equal nonzeros, or a graph partition by METIS.
//!
//! The distributed product (`backend::cpu::square::DistSquareOperator`, with the halo of
//! [`super::halo`]) works on contiguous row blocks ([`RowPartition`], from [`super::blocks`]). A
//! METIS partition assigns rows to ranks arbitrarily, so it is turned into a symmetric
//! permutation: the rows of part 0 first (in their original order), then part 1, and so on. The
//! permuted system P A P^T (P b) is split into contiguous blocks, one per part, and solved by
//! the unchanged code; x = P^T x' at the end. Contiguous and by-nonzero partitions use the
//! identity permutation, and one rank always does (so one rank is the plain serial solve).
//!
//! METIS partitions the undirected graph of A + A^T without self loops (the matrices are
//! nonsymmetric; a ghost entry is needed if row i refers to column j or row j to column i of
//! another part), with `METIS_PartGraphKway`, unit vertex weights (equal row counts within
//! METIS's default 3 % load imbalance) and the objective `METIS_OBJTYPE_VOL`: the total
//! communication volume (for each vertex, the number of other parts it has neighbours in),
//! which is the number of ghost values a product exchanges when the pattern is symmetric. On the
//! systems of docs/gmres.md it gives 5-20 % fewer ghosts than METIS's default edge-cut
//! objective.

use std::ops::Range;
use std::sync::Mutex;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::partition::halo::{comm_volume, CommVolume};
use crate::sparse::Csr;

/// The contiguous blocks a square-system partition ends in (defined in [`super::blocks`]).
pub use crate::partition::blocks::RowPartition;

/// How rows are assigned to ranks (`--partition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionMethod {
    /// Contiguous blocks of equal row counts.
    Contiguous,
    /// Contiguous blocks of about equal nonzero counts.
    #[default]
    Nnz,
    /// METIS k-way partition of the graph of A + A^T, applied as a symmetric permutation.
    Metis,
}

impl PartitionMethod {
    pub fn name(self) -> &'static str {
        match self {
            Self::Contiguous => "contiguous",
            Self::Nnz => "nnz",
            Self::Metis => "metis",
        }
    }
}

impl std::fmt::Display for PartitionMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

choice_from_str!(PartitionMethod, "partition", "contiguous" | "rows" => Self::Contiguous, "nnz" => Self::Nnz, "metis" => Self::Metis);

/// A symmetric permutation of 0..n: position i of the permuted system holds original index
/// `new_to_old[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    new_to_old: Vec<u32>,
    old_to_new: Vec<u32>,
}

impl Permutation {
    pub fn identity(n: usize) -> Self {
        let v: Vec<u32> = (0..n as u32).collect();
        Permutation {
            new_to_old: v.clone(),
            old_to_new: v,
        }
    }
    /// From the original index of each new position; checks that it is a permutation.
    pub fn from_new_to_old(new_to_old: Vec<u32>) -> Result<Self> {
        let n = new_to_old.len();
        let mut old_to_new = vec![u32::MAX; n];
        for (new, &old) in new_to_old.iter().enumerate() {
            let o = old as usize;
            if o >= n || old_to_new[o] != u32::MAX {
                return Err(Error::Invalid(format!(
                    "not a permutation of 0..{n}: index {old} at position {new}"
                )));
            }
            old_to_new[o] = new as u32;
        }
        Ok(Permutation {
            new_to_old,
            old_to_new,
        })
    }
    pub fn len(&self) -> usize {
        self.new_to_old.len()
    }
    pub fn is_empty(&self) -> bool {
        self.new_to_old.is_empty()
    }
    pub fn is_identity(&self) -> bool {
        self.new_to_old
            .iter()
            .enumerate()
            .all(|(i, &o)| i == o as usize)
    }
    pub fn new_to_old(&self) -> &[u32] {
        &self.new_to_old
    }
    pub fn old_to_new(&self) -> &[u32] {
        &self.old_to_new
    }
    /// Entries `range` of the permuted vector P x: `x[new_to_old[i]]` for i in range.
    pub fn permute_range(&self, x: &[f64], range: Range<usize>) -> Vec<f64> {
        assert_eq!(x.len(), self.len());
        self.new_to_old[range]
            .iter()
            .map(|&o| x[o as usize])
            .collect()
    }
    /// P x.
    pub fn permute(&self, x: &[f64]) -> Vec<f64> {
        self.permute_range(x, 0..self.len())
    }
    /// P^T x': back to the original order.
    pub fn unpermute(&self, xp: &[f64]) -> Vec<f64> {
        assert_eq!(xp.len(), self.len());
        self.old_to_new.iter().map(|&n| xp[n as usize]).collect()
    }
    /// Rows `range` of P A P^T (global, permuted column indices, sorted in each row).
    pub fn rows(&self, a: &Csr, range: Range<usize>) -> Result<Csr> {
        let n = self.len();
        if a.nrows() != n || a.ncols() != n {
            return Err(Error::Invalid(format!(
                "a permutation of {n} indices cannot reorder a {} x {} matrix",
                a.nrows(),
                a.ncols()
            )));
        }
        if range.end > n || range.start > range.end {
            return Err(Error::Invalid(format!(
                "rows {range:?} out of range for {n} rows"
            )));
        }
        if self.is_identity() {
            let rows: Vec<usize> = range.collect();
            return Ok(a.select_rows(&rows));
        }
        let old_rows = &self.new_to_old[range.clone()];
        let total: usize = old_rows.iter().map(|&o| a.row(o as usize).0.len()).sum();
        let mut indptr = Vec::with_capacity(range.len() + 1);
        let mut idx = Vec::with_capacity(total);
        let mut val = Vec::with_capacity(total);
        let mut pairs: Vec<(u32, f64)> = Vec::new();
        indptr.push(0u64);
        for &o in old_rows {
            let (c, v) = a.row(o as usize);
            pairs.clear();
            pairs.extend(
                c.iter()
                    .zip(v)
                    .map(|(&j, &x)| (self.old_to_new[j as usize], x)),
            );
            pairs.sort_unstable_by_key(|p| p.0);
            for &(j, x) in &pairs {
                idx.push(j);
                val.push(x);
            }
            indptr.push(idx.len() as u64);
        }
        Ok(Csr::try_new(range.len(), n, indptr, idx, val)?)
    }
    /// The whole of P A P^T.
    pub fn apply_symmetric(&self, a: &Csr) -> Result<Csr> {
        self.rows(a, 0..self.len())
    }
}

/// The adjacency (CSR, METIS's xadj/adjncy) of the undirected graph of A + A^T without self
/// loops: i and j (i != j) are neighbours when A has an entry (i, j) or (j, i).
pub fn symmetric_graph(a: &Csr) -> Result<(Vec<metis::Idx>, Vec<metis::Idx>)> {
    let n = a.nrows();
    if a.ncols() != n {
        return Err(Error::Invalid(format!(
            "graph partitioning needs a square matrix; got {n} x {}",
            a.ncols()
        )));
    }
    let too_large = || {
        Error::Invalid(format!(
            "METIS (32-bit indices) cannot partition a graph of {n} vertices and {} nonzeros",
            a.nnz()
        ))
    };
    if n >= metis::Idx::MAX as usize || 2 * a.nnz() >= metis::Idx::MAX as usize {
        return Err(too_large());
    }
    // Both directions of every off-diagonal entry, then sort and drop duplicates per row.
    let mut deg = vec![0usize; n + 1];
    for i in 0..n {
        for &j in a.row(i).0 {
            let j = j as usize;
            if j != i {
                deg[i + 1] += 1;
                deg[j + 1] += 1;
            }
        }
    }
    for i in 0..n {
        deg[i + 1] += deg[i];
    }
    let mut fill = deg.clone();
    let mut adj = vec![0 as metis::Idx; deg[n]];
    for i in 0..n {
        for &j in a.row(i).0 {
            let j = j as usize;
            if j != i {
                adj[fill[i]] = j as metis::Idx;
                fill[i] += 1;
                adj[fill[j]] = i as metis::Idx;
                fill[j] += 1;
            }
        }
    }
    let mut xadj = Vec::with_capacity(n + 1);
    xadj.push(0 as metis::Idx);
    let mut w = 0usize;
    for i in 0..n {
        let (s, e) = (deg[i], deg[i + 1]);
        adj[s..e].sort_unstable();
        let mut last = -1;
        for k in s..e {
            let j = adj[k];
            if j != last {
                adj[w] = j;
                w += 1;
                last = j;
            }
        }
        xadj.push(w as metis::Idx);
    }
    adj.truncate(w);
    adj.shrink_to_fit();
    Ok((xadj, adj))
}

/// The METIS part (0..parts) of each row of the square matrix `a`: k-way partition of the graph
/// of A + A^T. One part (or an empty matrix) needs no METIS: every row in part 0. Deterministic
/// (METIS's fixed default seed; calls are serialised, see below).
pub fn metis_parts(a: &Csr, parts: usize) -> Result<Vec<u32>> {
    let n = a.nrows();
    if parts == 0 {
        return Err(Error::Invalid("a partition needs at least one part".into()));
    }
    if parts == 1 || n == 0 {
        return Ok(vec![0; n]);
    }
    let (xadj, adjncy) = symmetric_graph(a)?;
    let np = metis::Idx::try_from(parts)
        .map_err(|_| Error::Invalid(format!("{parts} parts are too many for METIS")))?;
    let mut part = vec![0 as metis::Idx; n];
    // METIS (GKlib) draws from one process-wide random state that every call reseeds: two calls
    // at once race on it and give different partitions. One call at a time.
    static METIS_LOCK: Mutex<()> = Mutex::new(());
    let _one_at_a_time = METIS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    metis::Graph::new(1, np, &xadj, &adjncy)
        .map_err(|e| Error::Invalid(format!("METIS graph of {n} rows: {e}")))?
        // minimise the total communication volume (not the edge cut): the ghost values
        .set_option(metis::option::ObjType::Vol)
        .part_kway(&mut part)
        .map_err(|e| Error::Invalid(format!("METIS k-way partition into {parts} parts: {e}")))?;
    part.iter()
        .enumerate()
        .map(|(i, &p)| {
            if p < 0 || p >= np {
                Err(Error::Invalid(format!(
                    "METIS put row {i} in part {p} of {parts}"
                )))
            } else {
                Ok(p as u32)
            }
        })
        .collect()
}

/// The symmetric permutation that makes every part a contiguous block (parts in order, the
/// original order kept within a part), and those blocks.
pub fn permutation_from_parts(
    part_of: &[u32],
    parts: usize,
) -> Result<(Permutation, RowPartition)> {
    let mut bounds = vec![0usize; parts + 1];
    for (i, &p) in part_of.iter().enumerate() {
        let p = p as usize;
        if p >= parts {
            return Err(Error::Invalid(format!("row {i} is in part {p} of {parts}")));
        }
        bounds[p + 1] += 1;
    }
    for r in 0..parts {
        bounds[r + 1] += bounds[r];
    }
    let mut next = bounds.clone();
    let mut new_to_old = vec![0u32; part_of.len()];
    for (i, &p) in part_of.iter().enumerate() {
        new_to_old[next[p as usize]] = i as u32;
        next[p as usize] += 1;
    }
    Ok((
        Permutation::from_new_to_old(new_to_old)?,
        RowPartition { bounds },
    ))
}

/// A partition of a square system for `parts()` ranks: solve P A P^T x' = P b with rank r owning
/// rows `part.range(r)` of the permuted system; x = P^T x'.
#[derive(Debug, Clone)]
pub struct SquarePartition {
    pub method: PartitionMethod,
    pub perm: Permutation,
    pub part: RowPartition,
}

impl SquarePartition {
    pub fn parts(&self) -> usize {
        self.part.parts()
    }
    /// Rows of rank `r` (global permuted column indices), ready for
    /// `pipeline::square::gmres_square`.
    pub fn rank_rows(&self, a: &Csr, r: usize) -> Result<Csr> {
        self.perm.rows(a, self.part.range(r))
    }
    /// The original row index of every row rank `r` owns, in the rank's order.
    pub fn original_rows(&self, r: usize) -> &[u32] {
        &self.perm.new_to_old()[self.part.range(r)]
    }
    /// Communication of one distributed product under this partition.
    pub fn comm_volume(&self, a: &Csr) -> Result<CommVolume> {
        if self.perm.is_identity() {
            comm_volume(a, &self.part)
        } else {
            comm_volume(&self.perm.apply_symmetric(a)?, &self.part)
        }
    }
}

/// Partition the square matrix `a` for `parts` ranks (pure and deterministic).
pub fn partition_square(a: &Csr, method: PartitionMethod, parts: usize) -> Result<SquarePartition> {
    let n = a.nrows();
    if a.ncols() != n {
        return Err(Error::Invalid(format!(
            "partitioning a square system: the matrix is {n} x {}",
            a.ncols()
        )));
    }
    let parts = parts.max(1);
    let identity = |part| SquarePartition {
        method,
        perm: Permutation::identity(n),
        part,
    };
    Ok(match method {
        PartitionMethod::Contiguous => identity(RowPartition::contiguous(n, parts)),
        PartitionMethod::Nnz => identity(RowPartition::by_nnz(a.indptr(), parts)),
        PartitionMethod::Metis if parts == 1 => identity(RowPartition::contiguous(n, 1)),
        PartitionMethod::Metis => {
            let (perm, part) = permutation_from_parts(&metis_parts(a, parts)?, parts)?;
            SquarePartition { method, perm, part }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::Rng;
    use crate::testproblems::random_square;

    #[test]
    fn graph_is_the_symmetrised_pattern_without_the_diagonal() {
        // entries (0,1) (1,1) (2,0) (2,1) (0,0): edges 0-1, 0-2, 1-2; vertex 3 isolated
        let a = Csr::from_triplets(
            4,
            4,
            &[0, 1, 2, 2, 0],
            &[1, 1, 0, 1, 0],
            &[1.0, 2.0, 3.0, 4.0, 5.0],
        )
        .unwrap();
        let (x, adj) = symmetric_graph(&a).unwrap();
        assert_eq!(x, vec![0, 2, 4, 6, 6]);
        assert_eq!(adj, vec![1, 2, 0, 2, 0, 1]);
        let a = random_square(300, 4.0, 4, 7);
        let (x, adj) = symmetric_graph(&a).unwrap();
        for i in 0..300 {
            let nb = &adj[x[i] as usize..x[i + 1] as usize];
            assert!(nb.windows(2).all(|w| w[0] < w[1]));
            for &j in nb {
                let j = j as usize;
                assert_ne!(i, j);
                let has = |p: usize, q: usize| a.row(p).0.contains(&(q as u32));
                assert!(has(i, j) || has(j, i));
            }
            for &j in a.row(i).0 {
                if j as usize != i {
                    assert!(nb.contains(&(j as i32)));
                }
            }
        }
    }

    #[test]
    fn permutation_round_trips_and_reorders_the_product() {
        let n = 200;
        let a = random_square(n, 4.0, 4, 3);
        let mut rng = Rng::new(9);
        let part_of: Vec<u32> = (0..n).map(|_| rng.below(3) as u32).collect();
        let (perm, part) = permutation_from_parts(&part_of, 3).unwrap();
        assert_eq!(part.parts(), 3);
        for r in 0..3 {
            let rows = &perm.new_to_old()[part.range(r)];
            assert!(rows.iter().all(|&o| part_of[o as usize] == r as u32));
            assert!(rows.windows(2).all(|w| w[0] < w[1]), "order kept in a part");
        }
        let x: Vec<f64> = (0..n).map(|i| (i as f64).sin()).collect();
        assert_eq!(perm.unpermute(&perm.permute(&x)), x);
        // (P A P^T)(P x) = P (A x)
        let b = perm.apply_symmetric(&a).unwrap();
        let got = b.matvec(&perm.permute(&x));
        let want = perm.permute(&a.matvec(&x));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-14 * (1.0 + w.abs()));
        }
        assert!(Permutation::from_new_to_old(vec![0, 2, 2]).is_err());
        assert!(Permutation::from_new_to_old(vec![0, 3, 1]).is_err());
        assert!(permutation_from_parts(&[0, 1, 2], 2).is_err());
    }

    #[test]
    fn metis_parts_are_valid_in_edge_cases() {
        // no off-diagonal entries at all, more parts than rows, one part
        let d = Csr::from_triplets(5, 5, &[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4], &[1.0; 5]).unwrap();
        for parts in [1usize, 2, 3, 8] {
            let p = metis_parts(&d, parts).unwrap();
            assert_eq!(p.len(), 5);
            assert!(p.iter().all(|&q| (q as usize) < parts));
        }
        let a = random_square(50, 4.0, 4, 1);
        let p = metis_parts(&a, 64).unwrap();
        assert!(p.iter().all(|&q| q < 64));
        assert!(metis_parts(&a, 0).is_err());
        assert_eq!(metis_parts(&a, 1).unwrap(), vec![0; 50]);
    }
}
