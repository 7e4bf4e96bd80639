//! model.h5 says how it was made: /provenance attributes (time, command line, version, commit,
//! host, job, every input file with its CRC-32, the dataset manifest) and units on /history.

mod common;

use common::{demo_config, scratch, seistomo, stderr, str_attr as s_attr};
use hdf5::types::VarLenUnicode;

#[test]
fn demo_model_records_its_provenance() {
    let d = scratch("provenance");
    let cfg = demo_config("provenance", &d);
    let out = seistomo().arg("invert").arg(&cfg).output().unwrap();
    let _ = std::fs::remove_file(&cfg);
    assert!(out.status.success(), "{}", stderr(&out));
    let f = hdf5::File::open(d.join("model.h5")).unwrap();
    let p = f.group("provenance").unwrap();
    let created = s_attr(&p, "created_utc");
    assert!(created.len() == 20 && created.ends_with('Z'), "{created}");
    assert!(s_attr(&p, "command_line").contains("invert"));
    assert!(s_attr(&p, "command_line").contains(".test-provenance.toml"));
    assert_eq!(s_attr(&p, "seistomo_version"), env!("CARGO_PKG_VERSION"));
    assert!(!s_attr(&p, "git_commit").is_empty());
    assert!(!s_attr(&p, "host").is_empty());
    assert_eq!(p.attr("ranks").unwrap().read_scalar::<u64>().unwrap(), 1);
    assert!(s_attr(&p, "dataset_manifest").contains("seistomo-dataset"));
    let files: Vec<String> = p
        .attr("input_files")
        .unwrap()
        .read_raw::<VarLenUnicode>()
        .unwrap()
        .iter()
        .map(|s| s.to_string())
        .collect();
    let crcs = p
        .attr("input_crc32")
        .unwrap()
        .read_raw::<VarLenUnicode>()
        .unwrap();
    let sizes = p.attr("input_bytes").unwrap().read_raw::<u64>().unwrap();
    assert_eq!(files.len(), crcs.len());
    assert_eq!(files.len(), sizes.len());
    assert!(
        files.iter().any(|f| f.ends_with("dataset.toml")),
        "{files:?}"
    );
    assert!(files.iter().any(|f| f.ends_with(".test-provenance.toml")));
    // Each checksum is that of the file (the config was removed after the run).
    for ((f, c), n) in files.iter().zip(&crcs).zip(&sizes) {
        let path = std::path::Path::new(f);
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir().unwrap().join(path)
        };
        if let Ok((crc, len)) = seistomo::model::provenance::crc32_file(&path) {
            assert_eq!((format!("{crc:08x}"), len), (c.to_string(), *n), "{f}");
        }
    }
    let h = f.group("history").unwrap();
    let units = |n: &str| {
        h.dataset(n)
            .unwrap()
            .attr("units")
            .unwrap()
            .read_scalar::<VarLenUnicode>()
            .unwrap()
            .to_string()
    };
    assert_eq!(units("seconds"), "s");
    assert_eq!(units("itn"), "1");
    assert!(!units("r1norm").is_empty());
    let _ = std::fs::remove_dir_all(&d);
}
