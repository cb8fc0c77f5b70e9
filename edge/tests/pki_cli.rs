//! The `iop-edge pki` command line: exit codes, messages, and no private
//! key in anything it prints.

use std::process::{Command, Output};

fn edge(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iop-edge")).args(args).current_dir(dir).output().unwrap()
}

fn printed(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn pki_commands_succeed_refuse_and_never_print_a_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let url = "https://edge.example.lan:7443";
    let runs = [
        (vec!["pki", "init", "pki", "--name", "edge.example.lan"], Some(0), "wrote ca-key.pem, ca.pem"),
        (vec!["pki", "init", "pki", "--name", "edge.example.lan"], Some(1), "already holds a CA"),
        (vec!["pki", "node", "mac", "--dir", "pki", "--edge-url", url], Some(0), "- name: mac"),
        (vec!["pki", "node", "mac", "--dir", "pki", "--edge-url", "edge.example.lan"], Some(1), "--edge-url"),
        (vec!["pki", "node", "mac", "--dir", "elsewhere", "--edge-url", url], Some(1), "no CA in elsewhere"),
        (vec!["pki", "edge", "pki"], Some(0), "for edge.example.lan"),
        (vec!["pki", "init", "other", "--name", "not a name"], Some(1), "--name: `not a name`"),
        (vec!["pki", "init", "other"], Some(2), "--name <HOST>"),
        (vec!["pki", "init", "pki", "--name", "edge.example.lan", "--force"], Some(0), "wrote ca-key.pem"),
    ];
    for (args, code, says) in runs {
        let out = edge(&args, dir);
        let text = printed(&out);
        assert_eq!(out.status.code(), code, "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("PRIVATE KEY"), "{args:?}: {text}");
    }
    assert!(!dir.join("other").exists());
    assert!(dir.join("pki/nodes/mac/node-key.pem").exists());
}
