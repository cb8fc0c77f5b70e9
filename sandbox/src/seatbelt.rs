//! The macOS renderer: a Seatbelt (SBPL) profile for `sandbox-exec`, as
//! Codex CLI and Bazel use it.
//!
//! Paths never go into the profile text: each is a parameter (`-D
//! ROOT=/path`), referenced as `(param "ROOT")`, so a path with quotes or
//! parentheses cannot change the profile. The profile denies by default;
//! every allow that names a path carries the same `require-not` list of
//! denied paths, so no rule order matters.

use std::path::PathBuf;

use crate::policy::Policy;

/// The program that applies a profile.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// A rendered profile and the parameters it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub text: String,
    pub params: Vec<(String, PathBuf)>,
}

impl Profile {
    /// `sandbox-exec -p PROFILE -D NAME=VALUE ... -- argv...`
    pub fn command_line(&self, argv: &[String]) -> Vec<String> {
        let mut line = vec![SANDBOX_EXEC.to_string(), "-p".to_string(), self.text.clone()];
        for (name, value) in &self.params {
            line.push("-D".to_string());
            line.push(format!("{name}={}", value.display()));
        }
        line.push("--".to_string());
        line.extend(argv.iter().cloned());
        line
    }
}

/// What every command needs to start and run, whatever its workspace.
const BASE: &str = r#"(version 1)
(deny default)
(allow process-exec process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
(allow sysctl-read (require-all (require-not (sysctl-name "kern.procargs")) (require-not (sysctl-name "kern.procargs2"))))
(allow file-read-metadata)
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.notification_center")
  (global-name "com.apple.logd")
  (global-name "com.apple.trustd.agent"))
(allow ipc-posix-shm-read-data (ipc-posix-name "apple.shm.notification_center"))
"#;

/// Terminals and their ioctls (`TIOCSTI` types into one), denied last.
const TERMINALS: &str = "(deny file-read* file-write* file-ioctl (literal \"/dev/tty\") (literal \"/dev/console\") (literal \"/dev/ptmx\") (regex #\"^/dev/ttys\") (regex #\"^/dev/pty\"))\n";

/// The profile of `policy`.
pub fn profile(policy: &Policy) -> Profile {
    let mut params = vec![("ROOT".to_string(), policy.root.clone()), ("RESERVED".to_string(), policy.reserved.clone())];
    let denied: Vec<String> = policy
        .denied
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let name = format!("DENIED_{i}");
            params.push((name.clone(), path.clone()));
            name
        })
        .collect();
    let except: String = denied.iter().map(|name| format!(" (require-not (subpath (param \"{name}\")))")).collect();
    let mut text = String::from(BASE);
    let devices: String = policy.devices.iter().map(|d| format!(" (literal \"{}\")", sbpl_literal(d))).collect();
    text.push_str(&format!("(allow file-read* file-write-data file-ioctl{devices})\n"));
    for (i, path) in policy.read.iter().enumerate() {
        let name = format!("READ_{i}");
        params.push((name.clone(), path.clone()));
        text.push_str(&format!(
            "(allow file-read* file-map-executable (require-all (subpath (param \"{name}\")){except}))\n"
        ));
    }
    text.push_str(&format!(
        "(allow file-read* file-map-executable (require-all (subpath (param \"ROOT\")){except}))\n"
    ));
    text.push_str(&format!(
        "(allow file-write* (require-all (subpath (param \"ROOT\")) (require-not (subpath (param \"RESERVED\"))){except}))\n"
    ));
    for name in &denied {
        text.push_str(&format!("(deny file-read* file-write* (subpath (param \"{name}\")))\n"));
    }
    // No terminal, whatever else the owner made readable: the node's own
    // may be one of them.
    text.push_str(TERMINALS);
    if policy.network {
        text.push_str("(allow network* system-socket)\n");
    }
    Profile { text, params }
}

/// A device path as an SBPL string literal. Only the fixed [`DEVICES`]
/// list reaches here; anything that would need escaping is refused
/// rather than escaped.
///
/// [`DEVICES`]: crate::policy::DEVICES
fn sbpl_literal(path: &std::path::Path) -> String {
    let text = path.to_string_lossy();
    assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b'_'), "device path {text}");
    text.into_owned()
}

#[cfg(test)]
mod tests;
