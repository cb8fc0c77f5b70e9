//! Logs of `iop-edge` and `iop-node` written to a pipe (a pod's log, a
//! service manager, `2>file`) carry no ANSI colour codes. (`iop-operator`:
//! operator/tests/cli.rs.)

use std::process::Command;

use iop_e2e::harness::bin;

/// Runs `program --config <missing file>`: it logs why at ERROR and exits 2.
fn log_of(program: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin(program))
        .arg("--config")
        .arg(dir.path().join("missing.yaml"))
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{program}: {log}");
    assert!(log.contains("ERROR"), "{program} logged nothing: {log:?}");
    log
}

#[test]
fn edge_and_node_logs_have_no_colour_codes_off_a_terminal() {
    for program in ["iop-edge", "iop-node"] {
        let log = log_of(program);
        assert!(!log.contains('\u{1b}'), "{program}: colour codes in {log:?}");
    }
}
