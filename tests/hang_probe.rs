//! A test that never ends, for checking that the per-test time limit of `make test` works
//! (`make check-timeouts` runs it under .config/nextest.toml's `hang-check` profile and expects
//! it killed and failed within seconds). It is #[ignore]d, and without SEISTOMO_FORCE_HANG=1
//! (set only by `make check-timeouts`) it says so and ends at once, so `--include-ignored`
//! elsewhere does not hang on it.

use std::time::Duration;

#[test]
#[ignore = "hangs on purpose: make check-timeouts"]
fn forced_hang() {
    if std::env::var_os("SEISTOMO_FORCE_HANG").is_none() {
        eprintln!("not hanging: SEISTOMO_FORCE_HANG is not set (make check-timeouts sets it)");
        return;
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
