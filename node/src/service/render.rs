//! The service files, rendered from values: no I/O, no environment.

use std::path::Path;

use super::spec::{LABEL, ServiceSpec};

/// launchd's plist for `spec`, logging into `log_dir`.
///
/// - `KeepAlive = {SuccessfulExit = false}`, not `true`: the node exits 0
///   only when asked to stop (SIGTERM, Ctrl-C), so a clean exit is a
///   deliberate stop that launchd should respect; every failure exit or
///   crash is restarted (launchd spaces restarts by `ThrottleInterval`).
///   `RunAtLoad` starts it at install and at every login.
/// - `ProcessType = Interactive`, not `Background`: the node relays every
///   token a remote client streams, and Background's CPU and I/O throttling
///   and timer coalescing would add that latency to every request. Its own
///   CPU use is small (the model server does the work), so it costs the
///   Mac's user nothing.
/// - stderr (the node's log) and stdout (startup notices) go to two files
///   under `log_dir`; launchd creates them, not their directory.
pub fn plist(spec: &ServiceSpec, log_dir: &Path) -> String {
    let (log, out) = log_files(log_dir);
    let string = |s: &str| format!("<string>{}</string>", xml_escape(s));
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>Label</key>
	{label}
	<key>ProgramArguments</key>
	<array>
		{exe}
		<string>--config</string>
		{config}
	</array>
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<dict>
		<key>SuccessfulExit</key>
		<false/>
	</dict>
	<key>ThrottleInterval</key>
	<integer>10</integer>
	<key>ProcessType</key>
	<string>Interactive</string>
	<key>StandardErrorPath</key>
	{log}
	<key>StandardOutPath</key>
	{out}
</dict>
</plist>
"#,
        label = string(LABEL),
        exe = string(spec.exe()),
        config = string(spec.config()),
        log = string(&log),
        out = string(&out),
    )
}

/// The node's log (stderr) and stdout files under `log_dir`.
pub fn log_files(log_dir: &Path) -> (String, String) {
    let dir = log_dir.to_string_lossy();
    (format!("{dir}/iop-node.log"), format!("{dir}/iop-node.out.log"))
}

/// The systemd user unit for `spec`.
///
/// - `Restart=on-failure`, not `always`, for launchd's reason: a clean exit
///   is a deliberate stop (`systemctl stop` is never restarted either way).
/// - `RestartSec=5s`, growing over `RestartSteps=5` to
///   `RestartMaxDelaySec=60s` (systemd 254+; older versions log that they
///   ignore the two keys and restart every 5 s, still bounded).
/// - `StartLimitIntervalSec=0`: never give up. The node exits only when
///   its config or certificate files are unusable (it retries the Edge by
///   itself), and it should come back once they are fixed.
/// - Its log goes to the journal (`journalctl --user -u iop-node`).
pub fn unit(spec: &ServiceSpec) -> String {
    format!(
        "# Written by `iop-node service install`; `iop-node service uninstall` removes it.
[Unit]
Description=IOP node: dials the IOP Edge and runs local LLM providers
StartLimitIntervalSec=0

[Service]
Type=exec
ExecStart={exe} {flag} {config}
Restart=on-failure
RestartSec=5s
RestartSteps=5
RestartMaxDelaySec=60s

[Install]
WantedBy=default.target
",
        exe = systemd_quote_exe(spec.exe()),
        flag = systemd_quote("--config"),
        config = systemd_quote(spec.config()),
    )
}

/// Why systemd would refuse `exe` as `ExecStart=`'s executable: it takes
/// no quote or backslash there, whatever the escaping.
pub fn systemd_exe_problem(exe: &str) -> Option<&'static str> {
    exe.contains(['"', '\'', '\\'])
        .then_some("systemd refuses an executable path containing a quote or a backslash; move iop-node elsewhere")
}

/// `ExecStart=`'s executable: as [`systemd_quote`], except that `$` stays
/// single (systemd expands variables in the arguments only). The caller
/// checked [`systemd_exe_problem`].
fn systemd_quote_exe(exe: &str) -> String {
    systemd_quote(exe).replace("$$", "$")
}

/// Text for a plist `<string>`.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// One `ExecStart=` word: double-quoted, with `\` and `"` escaped, and `%`
/// (specifiers) and `$` (variable expansion) doubled, so systemd passes it
/// through unchanged. (Control characters never get here: see
/// `ServiceSpec::prepare`.)
pub fn systemd_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
