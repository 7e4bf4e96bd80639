//! Wrong words and conflicts on the command line end in one clear error (or a warning), not
//! in something silently different: plot's exclusive views, PNG only, --depth on a cell
//! model, --compare-true on a field without a true twin, export into an occupied directory,
//! --peclet as documented, lcurve points stopped by the iteration limit.

mod common;

use common::{root, scratch};
use std::process::Output;

fn run(args: &[&str], cwd: &std::path::Path) -> Output {
    common::seistomo()
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

use common::stderr as err;

#[test]
fn plot_refuses_conflicts_and_other_formats() {
    let d = scratch("words-plot");
    let cfg_path = common::demo_config("words", &d);
    let o = run(&["invert", cfg_path.to_str().unwrap()], &d);
    let _ = std::fs::remove_file(&cfg_path);
    assert!(o.status.success(), "{}", err(&o));
    let m = d.join("model.h5");
    let m = m.to_str().unwrap();
    let o = run(&["plot", m, "--depth", "2.5", "--section", "y=6"], &d);
    assert!(!o.status.success());
    assert!(err(&o).contains("cannot be used with"), "{}", err(&o));
    let o = run(&["plot", m, "--depth", "2.5", "-o", "x.jpg"], &d);
    assert!(!o.status.success());
    assert!(err(&o).contains("PNG"), "{}", err(&o));
    assert!(!d.join("x.jpg").exists());
    let o = run(
        &[
            "plot",
            m,
            "--depth",
            "2.5",
            "--field",
            "hit_count",
            "--compare-true",
        ],
        &d,
    );
    assert!(!o.status.success());
    assert!(err(&o).contains("a synthetic run, but"), "{}", err(&o));
    let o = run(&["plot", m, "--depth", "2.5", "--exaggeration", "2"], &d);
    assert!(!o.status.success(), "exaggeration on a map accepted");
    let o = run(
        &[
            "plot",
            m,
            "--section",
            "y=6",
            "--exaggeration",
            "2",
            "-o",
            "s.png",
        ],
        &d,
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(d.join("s.png").is_file());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn export_refuses_an_occupied_directory_and_square_takes_commas() {
    let d = scratch("words-export");
    let out = d.join("occupied");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let a = root().join("datasets/lsq/well1033.mtx.gz");
    let o = run(
        &["export", a.to_str().unwrap(), "-o", out.to_str().unwrap()],
        &d,
    );
    assert!(!o.status.success());
    assert!(err(&o).contains("exists and is not empty"), "{}", err(&o));
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
    let o = run(
        &["square", "--n", "4", "--peclet", "1,2,3", "-o", "A.mtx"],
        &d,
    );
    assert!(o.status.success(), "{}", err(&o));
    let text = std::fs::read_to_string(d.join("A.mtx")).unwrap();
    assert!(text.contains("peclet [1.0, 2.0, 3.0]"), "{}", &text[..200]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn lcurve_warns_about_points_at_the_iteration_limit() {
    let d = scratch("words-lcurve");
    let cfg = std::fs::read_to_string(root().join("configs/australia.toml"))
        .unwrap()
        .replace(
            "../datasets",
            &root().join("datasets").display().to_string(),
        )
        .replace("conlim = 1e14", "conlim = 1e14\niter_lim = 5")
        .replace(
            "\"../out/australia\"",
            &format!("{:?}", d.display().to_string()),
        );
    std::fs::write(d.join("run.toml"), cfg).unwrap();
    let o = run(
        &["lcurve", "run.toml", "--damping", "0.01,0.1,1", "-o", "lc"],
        &d,
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("istop 7"), "{}", err(&o));
    assert!(
        err(&o).contains("3 of 3 weights stopped at the iteration limit"),
        "{}",
        err(&o)
    );
    let _ = std::fs::remove_dir_all(&d);
}
