//! The `iop-node` command line: running the node still takes `--config`,
//! and `service` and `doctor` are wired. Nothing here reaches launchctl or
//! systemctl: every service command below fails before it would.

use std::process::{Command, Output};

fn iop_node(args: &[&str], home: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iop-node"))
        .args(args)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .expect("iop-node runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn running_the_node_still_requires_config_and_subcommands_are_listed() {
    let home = tempfile::tempdir().unwrap();
    let bare = iop_node(&[], home.path());
    assert_eq!(bare.status.code(), Some(2));
    assert!(text(&bare.stderr).contains("--config"), "{}", text(&bare.stderr));

    let help = iop_node(&["--help"], home.path());
    let help = text(&help.stdout);
    assert!(help.contains("service") && help.contains("doctor"), "{help}");

    let both = iop_node(&["--config", "node.yaml", "doctor", "--config", "node.yaml"], home.path());
    assert_eq!(both.status.code(), Some(2), "top-level flags do not mix with a subcommand");
}

#[test]
fn doctor_reports_and_exits_1_on_failure() {
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("missing.yaml");
    let out = iop_node(&["doctor", "--config", missing.to_str().unwrap()], home.path());
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("FAIL  config") && stdout.contains("missing.yaml"), "{stdout}");

    let bad_flag = iop_node(&["doctor", "--config", "x.yaml", "--provider", "vllm,http://x,m"], home.path());
    assert_eq!(bad_flag.status.code(), Some(2));
    assert!(text(&bad_flag.stderr).contains("unknown adapter `vllm`"), "{}", text(&bad_flag.stderr));
}

#[test]
fn service_install_refuses_a_config_that_does_not_load() {
    let home = tempfile::tempdir().unwrap();
    let bad = home.path().join("node.yaml");
    std::fs::write(&bad, "edge: { url: \"http://plain\" }\ntls: { ca_file: a, cert_file: b, key_file: c }\n").unwrap();
    let out = iop_node(&["service", "install", "--config", bad.to_str().unwrap()], home.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("refusing to install") && stderr.contains("edge.url"), "{stderr}");
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 1, "nothing was written under HOME");

    let usage = iop_node(&["service", "install"], home.path());
    assert_eq!(usage.status.code(), Some(2), "install needs --config");
}

/// The supervisor check runs before the arguments are parsed; a config
/// path that is not UTF-8 still gets the ordinary error, not a panic.
#[test]
fn a_non_utf8_argument_is_an_ordinary_error() {
    use std::os::unix::ffi::OsStrExt;
    let home = tempfile::tempdir().unwrap();
    let path = home.path().join(std::ffi::OsStr::from_bytes(b"\xffnode.yaml"));
    let out = Command::new(env!("CARGO_BIN_EXE_iop-node")).arg("--config").arg(&path).env("HOME", home.path()).output();
    let out = out.expect("iop-node runs");
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot read config file"), "{}", text(&out.stderr));
}

/// The hidden supervisor argument without the descriptors the node passes
/// refuses to run anything.
#[test]
fn the_supervisor_refuses_without_its_descriptors() {
    let home = tempfile::tempdir().unwrap();
    let invocation = r#"{"policy":null,"grace_ms":0,"argv":["touch","ran"]}"#;
    let mut command = Command::new(env!("CARGO_BIN_EXE_iop-node"));
    command.args(["__iop-sandbox-exec", invocation]).current_dir(home.path());
    // Whatever the test runner left open there (a jobserver pipe) is not
    // the node's handles.
    // SAFETY: close is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::close(3);
            libc::close(4);
            Ok(())
        });
    }
    let out = command.output().expect("iop-node runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(!home.path().join("ran").exists());
}
