use std::path::Path;

use super::*;
use crate::policy::{Authority, policy};

fn sample(network: bool) -> Policy {
    let node_files = [PathBuf::from("/Users/me/iop/node-key.pem"), PathBuf::from("/Users/me/iop")];
    let owner = [PathBuf::from("/Users/me/.cargo")];
    let authority = Authority {
        root: Path::new("/Users/me/site \") (allow default) (\""),
        network,
        owner_read: &owner,
        node_files: &node_files,
        home: None,
    };
    policy(&authority, &[PathBuf::from("/usr")])
}

fn value_of(profile: &Profile, name: &str) -> PathBuf {
    profile.params.iter().find(|(n, _)| n == name).unwrap().1.clone()
}

#[test]
fn the_profile_denies_by_default_and_names_paths_only_as_parameters() {
    let policy = sample(false);
    let profile = profile(&policy);
    let except: String =
        (0..policy.denied.len()).map(|i| format!(" (require-not (subpath (param \"DENIED_{i}\")))")).collect();
    let mut expected = String::from(BASE);
    expected.push_str("(allow file-read* file-write-data file-ioctl (literal \"/dev/null\") (literal \"/dev/zero\") (literal \"/dev/full\") (literal \"/dev/random\") (literal \"/dev/urandom\"))\n");
    for name in ["READ_0", "READ_1", "ROOT"] {
        expected.push_str(&format!(
            "(allow file-read* file-map-executable (require-all (subpath (param \"{name}\")){except}))\n"
        ));
    }
    expected.push_str(&format!(
        "(allow file-write* (require-all (subpath (param \"ROOT\")) (require-not (subpath (param \"RESERVED\"))){except}))\n"
    ));
    for i in 0..policy.denied.len() {
        expected.push_str(&format!("(deny file-read* file-write* (subpath (param \"DENIED_{i}\")))\n"));
    }
    expected.push_str(TERMINALS);
    assert_eq!(profile.text, expected);
    // No terminal among the devices, and every terminal denied last:
    // `TIOCSTI` into the node's terminal needs one.
    assert!(profile.text.ends_with(TERMINALS));
    assert!(TERMINALS.contains("(literal \"/dev/tty\")") && TERMINALS.contains("file-ioctl"));
    // Another process's arguments and environment (`ps -E`) are
    // `kern.procargs2`; its info and signals only within the sandbox.
    assert!(BASE.contains("(require-not (sysctl-name \"kern.procargs2\"))"));
    assert!(BASE.contains("(allow process-info* (target same-sandbox))"));
    assert!(!BASE.contains("(allow sysctl-read)\n"));
    // The hostile root is a parameter value, never profile text.
    assert!(!profile.text.contains("/Users"));
    let names: Vec<String> = profile.params.iter().map(|(n, _)| n.clone()).collect();
    let mut want = vec!["ROOT".to_string(), "RESERVED".to_string()];
    want.extend((0..policy.denied.len()).map(|i| format!("DENIED_{i}")));
    want.extend(["READ_0".to_string(), "READ_1".to_string()]);
    assert_eq!(names, want);
    let denied: Vec<PathBuf> = (0..policy.denied.len()).map(|i| value_of(&profile, &format!("DENIED_{i}"))).collect();
    assert_eq!(denied, policy.denied);
    let value = |name: &str| value_of(&profile, name);
    assert_eq!(value("DENIED_0"), Path::new("/Users/me/iop"));
    assert_eq!(value("READ_0"), Path::new("/Users/me/.cargo"));
    assert_eq!(value("READ_1"), Path::new("/usr"));
    assert!(!profile.text.contains("network"), "no network unless granted");
}

#[test]
fn network_is_one_rule_and_the_command_line_ends_with_the_argv() {
    let granted = profile(&sample(true));
    assert!(granted.text.ends_with("(allow network* system-socket)\n"));
    let line = granted.command_line(&["make".to_string(), "test".to_string()]);
    assert_eq!(&line[..2], [SANDBOX_EXEC, "-p"]);
    assert_eq!(line[2], granted.text);
    assert_eq!(line[3..5], ["-D".to_string(), "ROOT=/Users/me/site \") (allow default) (\"".to_string()]);
    assert_eq!(line[line.len() - 3..], ["--", "make", "test"]);
}
