//! Ranks balanced by cost (issue: two GPUs, twice the speed): compact storage with the grid's
//! damping rows as stencils on every rank gives one rank's solution on 1-4 ranks; the load plan
//! cuts damping rows at stencil-block boundaries and gives every rank about the same cost.

mod common;

use std::path::Path;

use common::pipeline_on_thread_ranks;
use seistomo::backend::storage::Storage;
use seistomo::io::dataset::{LoadOptions, OpenDataset};
use seistomo::partition::RowCost;
use seistomo::pipeline::options::{BackendChoice, SolveOptions, SystemSource};
use seistomo::solver::LsqrParams;

fn synth(name: &str, grid: &str, rays: &str) -> common::Scratch {
    common::synth_dataset("balance", name, grid, rays)
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn compact_storage_with_stencils_on_1_to_4_ranks_gives_one_ranks_solution() {
    let dir = synth("ranks", "16,14,10", "3000");
    let source = SystemSource::Dataset {
        path: dir.join("dataset.toml"),
        options: LoadOptions::default(),
        prepared: Default::default(),
    };
    let params = LsqrParams {
        atol: 1e-12,
        btol: 1e-12,
        ..Default::default()
    };
    let mut opts = SolveOptions::new(params, BackendChoice::Cpu);
    opts.operator.storage = Storage::Compact;
    opts.grid = Some([16, 14, 10]);
    let solve = |ranks| pipeline_on_thread_ranks(&source, &opts, ranks);
    let one = solve(1);
    assert!(
        one.report.storage.contains("stencil damping"),
        "{}",
        one.report.storage
    );
    let damping = one.calibration.stencil_rows;
    assert!(damping > 0);
    for ranks in 2..=4 {
        let o = solve(ranks);
        let d = rel(&o.solution.x, &one.solution.x);
        let t = &o.report.rank_timing;
        println!(
            "{ranks} ranks: istop {} its {} (one rank: istop {} its {}), x rel diff {d:e}; stencil rows per rank {:?}, cost {:?}",
            o.report.istop,
            o.report.iterations,
            one.report.istop,
            one.report.iterations,
            t.iter().map(|r| r.stencil_rows).collect::<Vec<_>>(),
            t.iter().map(|r| r.cost).collect::<Vec<_>>()
        );
        assert_eq!(o.report.istop, one.report.istop, "{ranks} ranks");
        assert!(d <= 1e-10, "{ranks} ranks: x differs by {d:e}");
        // every damping row is a stencil row on some rank, and every rank says what it did
        assert_eq!(t.len(), ranks);
        assert_eq!(t.iter().map(|r| r.stencil_rows).sum::<usize>(), damping);
        assert!(t.iter().all(|r| r.product_ms > 0.0 && r.allreduce_ms > 0.0));
        assert!(t.iter().all(|r| r.compute_s > 0.0), "{t:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cost of every rank of `path`'s plan over `size` ranks within `tol` of the mean, and each
/// rank's damping rows whole stencil blocks.
fn check_plan(path: &Path, cost: RowCost, size: usize, tol: f64) {
    let ds = OpenDataset::open(
        path,
        &LoadOptions {
            row_cost: Some(cost),
            ..Default::default()
        },
    )
    .unwrap();
    let p = ds.partition(size);
    let mean = p.load.iter().sum::<u64>() as f64 / size as f64;
    let spread: Vec<f64> = p.load.iter().map(|&l| l as f64 / mean - 1.0).collect();
    println!("{cost:?} on {size} ranks: cost / mean - 1 = {spread:.4?}");
    assert!(spread.iter().all(|s| s.abs() <= tol), "{spread:?}");
    let cuts = ds
        .damping_cuts()
        .expect("the damping rows are whole stencil blocks");
    for r in 0..size {
        let range = p.damping_range(r);
        for end in [range.start, range.end] {
            assert!(
                end == 0 || cuts.contains(&end),
                "rank {r}: {range:?} cuts a block"
            );
        }
    }
}

#[test]
fn the_cost_model_balances_the_64x64x40_dataset_within_5_percent() {
    let dir = synth("plan", "64,64,40", "150000");
    let path = dir.join("dataset.toml");
    for cost in [RowCost::CSR, RowCost::COMPACT_GPU, RowCost::COMPACT_CPU] {
        for size in 2..=4 {
            check_plan(&path, cost, size, 0.05);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
