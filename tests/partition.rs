//! Row partitions of square systems for distributed GMRES: contiguous rows, nonzero-balanced
//! rows, and METIS (a symmetric permutation that makes each part a contiguous block).
//! The communication-volume test prints the table of docs/gmres.md with --nocapture.

mod common;

use common::{agreed, on_thread_ranks, read_json, root, seistomo};

use seistomo::comm::{partition_square_on, Comm, SerialComm};
use seistomo::io::mtx;
use seistomo::partition::blocks::RowPartition;
use seistomo::partition::graph::{metis_parts, partition_square, PartitionMethod, SquarePartition};
use seistomo::partition::halo::{comm_volume, CommVolume};
use seistomo::pipeline::operators::SquareSystem;
use seistomo::pipeline::square::gmres_square_cpu;
use seistomo::solver::dist_square::{SquarePrecond, SquareSolve};
use seistomo::solver::gmres::{ConvergenceTest, GmresParams, NoGmresMonitor, Orthog, PrecondSide};
use seistomo::sparse::Csr;
use seistomo::testproblems::square::{cube, SquareKind};

const METHODS: [PartitionMethod; 3] = [
    PartitionMethod::Contiguous,
    PartitionMethod::Nnz,
    PartitionMethod::Metis,
];

fn real(name: &str) -> Csr {
    mtx::read_matrix(root().join(format!("datasets/square/{name}.mtx.gz"))).unwrap()
}

/// The ghost values of a partition counted directly in the original numbering: for each part,
/// the distinct columns its rows reference that another part owns; and the (receiver, owner)
/// pairs with at least one such value.
fn ghosts_by_definition(a: &Csr, part_of: &[u32], parts: usize) -> (usize, usize) {
    let mut seen = vec![usize::MAX; a.ncols()];
    let (mut total, mut msgs) = (0, 0);
    for p in 0..parts {
        let mut from = vec![false; parts];
        for i in (0..a.nrows()).filter(|&i| part_of[i] as usize == p) {
            for &j in a.row(i).0 {
                let j = j as usize;
                let q = part_of[j] as usize;
                if q != p && seen[j] != p {
                    seen[j] = p;
                    total += 1;
                    from[q] = true;
                }
            }
        }
        msgs += from.iter().filter(|&&f| f).count();
    }
    (total, msgs)
}

fn check_partition(a: &Csr, sp: &SquarePartition, tag: &str) {
    let n = a.nrows();
    let parts = sp.parts();
    // every row exactly once
    let mut count = vec![0u8; n];
    for r in 0..parts {
        for &o in sp.original_rows(r) {
            count[o as usize] += 1;
        }
    }
    assert!(
        count.iter().all(|&c| c == 1),
        "{tag}: a row is missing or repeated"
    );
    assert_eq!(sp.part.bounds[0], 0);
    assert_eq!(*sp.part.bounds.last().unwrap(), n);
    // the permuted blocks are the parts: the volume through the permuted system equals the
    // ghosts counted in the original numbering
    let mut part_of = vec![0u32; n];
    for r in 0..parts {
        for &o in sp.original_rows(r) {
            part_of[o as usize] = r as u32;
        }
    }
    let v = sp.comm_volume(a).unwrap();
    let (total, msgs) = ghosts_by_definition(a, &part_of, parts);
    assert_eq!(v.total_values, total, "{tag}: volume");
    assert_eq!(v.messages, msgs, "{tag}: messages");
}

#[test]
fn metis_partitions_are_valid_and_balanced() {
    let mut systems: Vec<(String, Csr)> = vec![
        ("convdiff16".into(), cube(SquareKind::Convdiff, 16).unwrap()),
        ("poisson12".into(), cube(SquareKind::Poisson, 12).unwrap()),
    ];
    for name in ["west0479", "nnc1374", "bayer10"] {
        systems.push((name.into(), real(name)));
    }
    for (name, a) in &systems {
        let n = a.nrows();
        for parts in [1usize, 2, 3, 4, 8] {
            let sp = partition_square(a, PartitionMethod::Metis, parts).unwrap();
            let tag = format!("{name} P={parts}");
            assert_eq!(sp.parts(), parts, "{tag}");
            assert_eq!(sp.perm.is_identity(), parts == 1, "{tag}");
            check_partition(a, &sp, &tag);
            // METIS's k-way default load imbalance is 3 % (ufactor 30) on unit vertex
            // weights; allow one more row for the rounding of n / parts.
            let limit = (1.03 * n as f64 / parts as f64).ceil() as usize + 1;
            let sizes: Vec<usize> = (0..parts).map(|r| sp.part.range(r).len()).collect();
            assert!(
                sizes.iter().all(|&s| s <= limit && s > 0),
                "{tag}: part sizes {sizes:?}, limit {limit}"
            );
            // same input, same partition (rank 0 computes it in MPI runs, but tests and
            // `comm_volume` recompute it)
            assert!(
                metis_parts(a, parts).unwrap() == metis_parts(a, parts).unwrap(),
                "{tag}: two METIS calls disagree"
            );
        }
        for m in [PartitionMethod::Contiguous, PartitionMethod::Nnz] {
            let sp = partition_square(a, m, 4).unwrap();
            assert!(sp.perm.is_identity());
            check_partition(a, &sp, &format!("{name} {m}"));
        }
    }
}

fn volumes(a: &Csr, parts: usize) -> Vec<CommVolume> {
    METHODS
        .iter()
        .map(|&m| {
            partition_square(a, m, parts)
                .unwrap()
                .comm_volume(a)
                .unwrap()
        })
        .collect()
}

/// The table in docs/gmres.md (`cargo test --test partition communication_volume -- --nocapture`)
/// and the checks: METIS never receives more values than contiguous or nnz blocks, strictly
/// fewer for 4 and 8 parts (with 2 parts a slab of a grid is already a minimal cut, and so are
/// the halves of nnc1374), and less than two thirds on bayer10, whose couplings are not local
/// in the row order.
#[test]
fn communication_volume_by_partition_method() {
    let mut systems: Vec<(String, Csr)> = vec![
        (
            "convdiff 16^3".into(),
            cube(SquareKind::Convdiff, 16).unwrap(),
        ),
        (
            "convdiff 24^3".into(),
            cube(SquareKind::Convdiff, 24).unwrap(),
        ),
    ];
    for name in ["west0479", "nnc1374", "bayer10"] {
        systems.push((name.into(), real(name)));
    }
    eprintln!("| system | ranks | partition | values received (total) | max one rank | messages | nnz per rank (max / min) |");
    eprintln!("|---|---|---|---|---|---|---|");
    for (name, a) in &systems {
        for parts in [2usize, 4, 8] {
            let v = volumes(a, parts);
            for (m, v) in METHODS.iter().zip(&v) {
                eprintln!(
                    "| {name} | {parts} | {m} | {} | {} | {} | {} / {} |",
                    v.total_values, v.max_values, v.messages, v.max_nnz, v.min_nnz
                );
            }
            let (vc, vn, vm) = (&v[0], &v[1], &v[2]);
            let tag = format!("{name} P={parts}: metis {vm:?}\n contiguous {vc:?}");
            assert!(vm.total_values <= vc.total_values, "{tag}");
            assert!(vm.total_values <= vn.total_values, "{tag}");
            if parts >= 4 {
                assert!(vm.total_values < vc.total_values, "{tag}");
            }
            if *name == "bayer10" {
                // couplings far from the diagonal: contiguous rows receive most of x
                assert!(3 * vm.total_values < 2 * vc.total_values, "{tag}");
            }
        }
    }
    // a grid in 8 parts: slabs exchange 14 planes (3584 values at n = 16); METIS's blocks
    // exchange much less
    let a = cube(SquareKind::Convdiff, 16).unwrap();
    let v = volumes(&a, 8);
    assert_eq!(v[0].total_values, 2 * 7 * 256);
    assert!(v[2].total_values * 3 < v[0].total_values * 2, "{:?}", v[2]);
}

fn params() -> GmresParams {
    GmresParams {
        restart: 16,
        rtol: 1e-10,
        atol: 0.0,
        max_iter: 4000,
        max_cycles: None,
        orthog: Orthog::Cgs2,
        side: PrecondSide::Left,
        test: ConvergenceTest::Preconditioned,
        arnoldi_loop: Default::default(),
    }
}

/// GMRES with Jacobi and [`params`] on the CPU: this rank's `rows` of a system split by `part`,
/// its entries of b.
fn jacobi_gmres(c: &dyn Comm, rows: &Csr, part: &RowPartition, b: &[f64]) -> SquareSolve {
    let sys = SquareSystem {
        rows,
        part,
        b,
        x0: None,
    };
    gmres_square_cpu(
        c,
        sys,
        SquarePrecond::Jacobi,
        &params(),
        &mut NoGmresMonitor,
    )
    .unwrap()
}

/// P thread ranks, the whole matrix on each, partitioned by `partition_square_on` (METIS on rank
/// 0, broadcast), b = ones; returns x in the original order, the iterations, and the halo.
fn solve_ranks(a: &Csr, parts: usize, method: PartitionMethod) -> (Vec<f64>, usize, CommVolume) {
    let n = a.nrows();
    let out = on_thread_ranks(parts, |c| {
        let sp = partition_square_on(c, a, method).unwrap();
        let rows = sp.rank_rows(a, c.rank()).unwrap();
        let b = sp
            .perm
            .permute_range(&vec![1.0; n], sp.part.range(c.rank()));
        let sol = jacobi_gmres(c, &rows, &sp.part, &b);
        assert!(sol.info.stop.converged);
        let x = c.gather_to_root(&sol.x_local).unwrap();
        (
            x.map(|x| sp.perm.unpermute(&x)),
            sol.info.stop.iterations,
            sol.halo,
        )
    });
    let its = agreed(out.iter().map(|o| o.1), "iterations");
    agreed(out.iter().map(|o| o.2.clone()), "the halo");
    let (x, _, halo) = out.into_iter().next().unwrap();
    (x.unwrap(), its, halo)
}

fn rel_diff(x: &[f64], y: &[f64]) -> f64 {
    let d: f64 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
    (d / y.iter().map(|b| b * b).sum::<f64>()).sqrt()
}

#[test]
fn permuted_solves_equal_the_unpermuted_solve() {
    let a = cube(SquareKind::Convdiff, 12).unwrap();
    let n = a.nrows();
    let one = SerialComm;
    let serial = jacobi_gmres(&one, &a, &RowPartition::contiguous(n, 1), &vec![1.0; n]);
    assert!(serial.info.stop.converged);
    assert!(serial.info.stop.iterations > 20);
    for parts in 1..=4 {
        for m in METHODS {
            let (x, its, halo) = solve_ranks(&a, parts, m);
            let sp = partition_square(&a, m, parts).unwrap();
            // the halo each run measured is the one `comm_volume` predicts
            assert_eq!(halo, sp.comm_volume(&a).unwrap(), "{m} P={parts}");
            assert_eq!(its, serial.info.stop.iterations, "{m} P={parts}");
            let d = rel_diff(&x, &serial.x_local);
            assert!(d <= 1e-10, "{m} P={parts}: {d:e}");
            if parts == 1 {
                assert_eq!(x, serial.x_local, "{m}: one rank is the serial solve");
            }
        }
    }
    // the permuted system on ONE rank (a METIS order for 4 parts, solved whole) is the same
    // system: same iterations, same solution
    let sp = partition_square(&a, PartitionMethod::Metis, 4).unwrap();
    assert!(!sp.perm.is_identity());
    let pa = sp.perm.apply_symmetric(&a).unwrap();
    assert_eq!(
        comm_volume(&pa, &sp.part).unwrap(),
        sp.comm_volume(&a).unwrap()
    );
    let sol = jacobi_gmres(
        &one,
        &pa,
        &RowPartition::contiguous(n, 1),
        &sp.perm.permute(&vec![1.0; n]),
    );
    assert_eq!(sol.info.stop.iterations, serial.info.stop.iterations);
    assert!(rel_diff(&sp.perm.unpermute(&sol.x_local), &serial.x_local) <= 1e-10);
}

fn read_vec(p: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// `solve --method gmres --partition ...` on one process: every choice is the serial solve (one
/// rank never reorders) and the report names the partition; a bad value is refused.
#[test]
fn cli_partition_flag() {
    let d = common::scratch("partition-cli");
    let m = root().join("datasets/square_gen/convdiff16.mtx.gz");
    let mut xs = Vec::new();
    for p in ["contiguous", "nnz", "metis"] {
        let (x, r) = (d.join(format!("{p}.x")), d.join(format!("{p}.json")));
        let o = seistomo()
            .args(["solve", "--method", "gmres", "--partition", p, "--matrix"])
            .arg(&m)
            .arg("--solution")
            .arg(&x)
            .arg("--report")
            .arg(&r)
            .output()
            .unwrap();
        assert!(o.status.success(), "{p}: {}", common::stderr(&o));
        let rep = read_json(&r);
        assert_eq!(rep["partition"], p);
        assert_eq!(rep["converged"], true);
        assert_eq!(rep["halo"]["parts"], 1);
        assert_eq!(rep["halo"]["total_values"], 0);
        xs.push(read_vec(&x));
    }
    assert!(
        xs[0] == xs[1] && xs[1] == xs[2],
        "one process: the same solve"
    );
    let o = seistomo()
        .args([
            "solve",
            "--method",
            "gmres",
            "--partition",
            "scotch",
            "--matrix",
        ])
        .arg(&m)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = common::stderr(&o);
    // clap names the word and lists the possible values (src/cli/args.rs).
    assert!(
        e.contains("invalid value 'scotch'") && e.contains("contiguous, nnz, metis"),
        "{e}"
    );
}
