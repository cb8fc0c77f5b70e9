//! Probes the real parts the end-to-end tests need (`src/parts.rs`): each
//! absent one sets `iop_absent_<part>`, which ignores the tests that need it,
//! so the runner reports them as skipped. `IOP_REQUIRE_ALL=1` ignores none.

#[path = "src/parts.rs"]
#[allow(dead_code)]
mod parts;

use parts::Part;

fn main() {
    for part in Part::ALL {
        println!("cargo::rustc-check-cfg=cfg({})", part.cfg());
    }
    for var in parts::ENV_VARS {
        println!("cargo::rerun-if-env-changed={var}");
    }
    // The stamp must exist: a missing watched file would rerun this (and
    // rebuild every e2e test) on every build.
    let stamp = parts::cache_dir().join(parts::STAMP);
    if !stamp.exists() {
        let _ = std::fs::create_dir_all(parts::cache_dir());
        let _ = std::fs::write(&stamp, b"");
    }
    if stamp.exists() {
        println!("cargo::rerun-if-changed={}", stamp.display());
    }
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/parts.rs");

    let absent: Vec<Part> = if parts::require_all() {
        Vec::new()
    } else {
        Part::ALL.into_iter().filter(|part| part.probe().is_err()).collect()
    };
    for part in &absent {
        println!("cargo::rustc-cfg={}", part.cfg());
    }
    let summary = parts::summary(&absent);
    if let Some(line) = &summary {
        println!("cargo::warning={line}");
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("absent-parts"), summary.map(|s| s + "\n").unwrap_or_default())
        .expect("writing OUT_DIR/absent-parts");
}
