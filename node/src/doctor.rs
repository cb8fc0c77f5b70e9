//! `iop-node doctor --config FILE`: checks what the node needs, one line per
//! check (`OK`, `WARN`, `FAIL`, or `SKIP` when an earlier failure leaves
//! nothing to check), each failure with what to fix. Exit code 1 when any
//! check fails.
//!
//! Checks, in order: the config loads (the node's own loader); the CA,
//! certificate and key files are readable and hold PEM; the node
//! certificate's validity (against an injected clock) and identity; the
//! key belongs to the certificate; the Edge answers on TCP; a real TLS
//! handshake with the node's client certificate succeeds and the Edge
//! accepts it (see [`edge`]); local providers answer their health probe
//! ([`crate::adapter::probe`], the one definition of healthy).
//!
//! Which providers a node runs is assigned by the Edge at registration; the
//! node config lists none, and the doctor does not register (that would
//! replace the running node's session). It probes the providers named with
//! `--provider`, and says so when there are none.
//!
//! Output never contains key material: key files are read into
//! [`KeyPem`](crate::transport::tls::KeyPem) and only rustls sees their bytes.

mod cert;
mod check;
mod edge;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use iop_proto::pb;

use crate::adapter::probe::{ProbeFailure, probe};
use crate::adapter::{AdapterKind, ProviderTarget};
use crate::config::{NodeConfig, NodeTlsConfig};
use crate::transport::tls::{self, ClientConfigError, KeyPem, TlsFiles};

pub use cert::EXPIRY_WARNING_SECS;
pub use check::{BUNDLE_SOURCES, Check, Level};

/// Default bound of the TCP connect and of each TLS read and write.
pub const EDGE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.level == Level::Fail)
    }

    /// 0 when no check failed, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.failed())
    }

    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    fn count(&self, level: Level) -> usize {
        self.checks.iter().filter(|c| c.level == level).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        write!(
            f,
            "{} OK, {} WARN, {} FAIL, {} SKIP",
            self.count(Level::Ok),
            self.count(Level::Warn),
            self.count(Level::Fail),
            self.count(Level::Skip)
        )
    }
}

/// A provider on this machine to probe: `KIND,BASE_URL,MODEL`, e.g.
/// `ollama,http://127.0.0.1:11434,llama3.2` or
/// `openai,http://127.0.0.1:1234,qwen2.5-7b-instruct` (as the Edge config's
/// `adapter`, `target.base_url` and `target.model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProvider {
    pub adapter: AdapterKind,
    pub base_url: String,
    pub model: String,
}

impl FromStr for LocalProvider {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            "expected KIND,BASE_URL,MODEL with KIND ollama or openai, e.g. ollama,http://127.0.0.1:11434,llama3.2";
        let mut parts = s.splitn(3, ',').map(str::trim);
        let (Some(kind), Some(base_url), Some(model)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(usage.into());
        };
        let adapter = match kind {
            "ollama" => AdapterKind::Ollama,
            "openai" => AdapterKind::OpenAi,
            _ => return Err(format!("unknown adapter `{kind}`: {usage}")),
        };
        if base_url.is_empty() || model.is_empty() {
            return Err(usage.into());
        }
        Ok(Self { adapter, base_url: base_url.into(), model: model.into() })
    }
}

impl LocalProvider {
    fn name(&self) -> &'static str {
        match self.adapter {
            AdapterKind::Ollama => "ollama",
            AdapterKind::OpenAi => "openai",
        }
    }

    /// Validated exactly as an assignment from the Edge is.
    fn target(&self) -> Result<ProviderTarget, String> {
        let assignment = pb::ProviderAssignment {
            provider_id: format!("{} {}", self.name(), self.model),
            adapter: self.adapter.to_wire() as i32,
            target_model: self.model.clone(),
            base_url: self.base_url.clone(),
            ..Default::default()
        };
        ProviderTarget::from_assignment(&assignment).map_err(|e| e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub providers: Vec<LocalProvider>,
    /// The clock for certificate validity.
    pub now: SystemTime,
    pub edge_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self { providers: Vec::new(), now: SystemTime::now(), edge_timeout: EDGE_TIMEOUT }
    }
}

/// Runs every check against the config at `config_path`.
pub async fn run(config_path: &Path, options: &Options) -> Report {
    let mut report = Report::default();
    let checks = &mut report.checks;
    let config = match NodeConfig::load(config_path) {
        Ok(config) => config,
        Err(e) => {
            checks.push(Check::fail(
                "config",
                e.to_string(),
                "fix the file (see examples/node.yaml; every field is in docs/configuration.md)",
            ));
            return report;
        }
    };
    checks.push(Check::ok(
        "config",
        format!("{} loads; edge {} (server name {})", config_path.display(), config.edge.url, server_name(&config)),
    ));
    let now = unix_secs(options.now);
    let files = check_files(&config.tls, now, checks);

    let tls_config = match files.as_ref().map(tls::client_config) {
        Some(Ok(client)) => {
            checks.push(Check::ok("key pair", "tls.key_file is the key of tls.cert_file"));
            Some(Arc::new(client))
        }
        Some(Err(e)) => {
            checks.push(key_pair_failure(&e));
            None
        }
        None => {
            checks.push(Check::skip("key pair", "needs a readable certificate and key"));
            None
        }
    };

    let (host, port) = config.edge_host_port().unwrap_or_default();
    let name = server_name(&config);
    let timeout = options.edge_timeout;
    let edge = tokio::task::spawn_blocking(move || {
        let (tcp_check, stream) = edge::connect(&host, port, timeout);
        let tls_check = match (stream, tls_config) {
            (None, _) => Check::skip("edge tls", "needs a TCP connection to the Edge"),
            (Some(_), None) => Check::skip("edge tls", "needs a usable CA, certificate and key (see above)"),
            (Some(stream), Some(tls_config)) => match rustls::pki_types::ServerName::try_from(name.clone()) {
                Ok(server) => edge::tls_check(&edge::handshake(stream, tls_config, server, timeout), &name, timeout),
                Err(e) => Check::fail(
                    "edge tls",
                    format!("`{name}` is not a valid TLS server name: {e}"),
                    "set edge.server_name to a DNS name or IP address on the Edge's certificate",
                ),
            },
        };
        [tcp_check, tls_check]
    })
    .await;
    match edge {
        Ok(edge_checks) => checks.extend(edge_checks),
        Err(e) => checks.push(Check::fail("edge", format!("the check did not finish: {e}"), "run doctor again")),
    }

    check_providers(&options.providers, checks).await;
    report
}

fn server_name(config: &NodeConfig) -> String {
    config.server_name().unwrap_or_default()
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The three files; `Some` when all three were read (whatever they hold:
/// the key pair check judges the contents together).
fn check_files(tls: &NodeTlsConfig, now: i64, checks: &mut Vec<Check>) -> Option<TlsFiles> {
    let ca = read(
        "tls.ca_file",
        &tls.ca_file,
        checks,
        "the CA that signed the Edge's certificate (ca.pem of the node bundle)",
    )
    .inspect(|pem| checks.push(ca_check(&tls.ca_file, pem, now)));

    let cert = read("tls.cert_file", &tls.cert_file, checks, "this node's certificate (node.pem of the node bundle)");
    match cert.as_deref().map(tls::parse_certs) {
        Some(chain) if chain.is_empty() => {
            checks.push(Check::fail(
                "certificate",
                format!("{} holds no PEM certificate", tls.cert_file.display()),
                "use node.pem of the node bundle",
            ));
            checks.push(Check::skip("identity", "needs a certificate"));
        }
        Some(chain) => match cert::inspect(&chain[0]) {
            Ok(facts) => {
                checks.push(cert::expiry_check(&facts, now));
                checks.push(cert::identity_check(&facts));
            }
            Err(e) => {
                checks.push(Check::fail(
                    "certificate",
                    format!("{}: {e}", tls.cert_file.display()),
                    "use node.pem of the node bundle",
                ));
                checks.push(Check::skip("identity", "needs a readable certificate"));
            }
        },
        None => {
            checks.push(Check::skip("certificate", "needs tls.cert_file"));
            checks.push(Check::skip("identity", "needs tls.cert_file"));
        }
    }

    let key = read("tls.key_file", &tls.key_file, checks, "this node's private key (node-key.pem of the node bundle)")
        .map(KeyPem::new);
    if let Some(key) = &key {
        checks.push(key_file_check(&tls.key_file, key));
    }
    Some(TlsFiles { ca: ca?, cert: cert?, key: key? })
}

/// Reads one file; a failure is a FAIL line naming the field and the path.
fn read(field: &'static str, path: &Path, checks: &mut Vec<Check>, what: &str) -> Option<Vec<u8>> {
    match tls::read_file(field, path) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            checks.push(Check::fail(field, e.to_string(), format!("point {field} at {what}")));
            None
        }
    }
}

fn ca_check(path: &Path, pem: &[u8], now: i64) -> Check {
    let certs = tls::parse_certs(pem);
    if certs.is_empty() {
        return Check::fail(
            "tls.ca_file",
            format!("{} holds no PEM certificate", path.display()),
            "use ca.pem of the node bundle",
        );
    }
    let mut worst = (Level::Ok, String::new());
    for (i, der) in certs.iter().enumerate() {
        let what = format!("CA certificate {}", i + 1);
        let verdict = match cert::inspect(der) {
            Ok(facts) => cert::validity(&what, &facts, now),
            Err(e) => (Level::Fail, format!("{what}: {e}")),
        };
        if worst.1.is_empty() || rank(verdict.0) > rank(worst.0) {
            worst = verdict;
        }
    }
    let detail = format!("{}: {} certificate(s); {}", path.display(), certs.len(), worst.1);
    match worst.0 {
        Level::Ok | Level::Skip => Check::ok("tls.ca_file", detail),
        Level::Warn => Check::warn("tls.ca_file", detail, "get the Edge's new CA (ca.pem of a fresh node bundle)"),
        Level::Fail => Check::fail("tls.ca_file", detail, "get the Edge's current CA (ca.pem of a fresh node bundle)"),
    }
}

fn rank(level: Level) -> u8 {
    match level {
        Level::Skip => 0,
        Level::Ok => 1,
        Level::Warn => 2,
        Level::Fail => 3,
    }
}

/// The key file holds a PEM private key, readable by its owner only.
fn key_file_check(path: &Path, key: &KeyPem) -> Check {
    if tls::parse_key(key).is_none() {
        return Check::fail(
            "tls.key_file",
            format!("{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display()),
            "use node-key.pem of the node bundle",
        );
    }
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
    };
    if mode & 0o077 != 0 {
        return Check::warn(
            "tls.key_file",
            format!("{}: private key, readable by other users (mode {mode:o})", path.display()),
            format!("chmod 600 {}", path.display()),
        );
    }
    Check::ok("tls.key_file", format!("{}: private key, readable only by its owner", path.display()))
}

fn key_pair_failure(e: &ClientConfigError) -> Check {
    match e {
        ClientConfigError::Identity(rustls::Error::InconsistentKeys(_)) => Check::fail(
            "key pair",
            "tls.key_file is not the key of tls.cert_file (their public keys differ)",
            "use the certificate and key issued together (node.pem and node-key.pem of the same node bundle)",
        ),
        // The per-file lines above already say which file holds nothing usable.
        ClientConfigError::NoCaCertificate | ClientConfigError::NoCertificate | ClientConfigError::NoKey => {
            Check::skip("key pair", e.to_string())
        }
        ClientConfigError::Identity(_) => Check::fail(
            "key pair",
            e.to_string(),
            "use an RSA, ECDSA (P-256/P-384) or Ed25519 key issued with the certificate",
        ),
    }
}

async fn check_providers(providers: &[LocalProvider], checks: &mut Vec<Check>) {
    if providers.is_empty() {
        checks.push(Check::skip(
            "providers",
            "none probed: the Edge assigns this node its providers when it registers and the node config lists \
             none; name local ones with --provider KIND,BASE_URL,MODEL (e.g. --provider \
             ollama,http://127.0.0.1:11434,llama3.2)",
        ));
        return;
    }
    let client = crate::adapter::http_client();
    for provider in providers {
        let name = format!("provider {}", provider.name());
        let shown = format!("{} `{}` at {}", provider.name(), provider.model, provider.base_url);
        let target = match provider.target() {
            Ok(target) => target,
            Err(e) => {
                checks.push(Check::fail(&name, e, "give BASE_URL as http(s)://host[:port], without /v1"));
                continue;
            }
        };
        let verdict = probe(&client, &target).await;
        let call = match provider.adapter {
            AdapterKind::Ollama => "POST /api/show",
            AdapterKind::OpenAi => "GET /v1/models",
        };
        checks.push(match verdict.failure {
            None => Check::ok(&name, format!("{shown} answered its health probe ({call})")),
            // The node probes without a key too, and takes this for "up" when
            // the Edge manages the provider's credential; the doctor cannot
            // know whether it does.
            Some(failure @ ProbeFailure::Status(401 | 403)) => Check::warn(
                &name,
                format!("{shown}: {call}: {failure}: the server is up and wants an API key"),
                "fine if the Edge manages this provider's key (providers[].credential.profile); otherwise the                  provider will refuse the node's requests",
            ),
            Some(failure) => {
                let fix = match (provider.adapter, &failure) {
                    (AdapterKind::Ollama, ProbeFailure::Status(404)) => {
                        format!("pull the model: `ollama pull {}`", provider.model)
                    }
                    (AdapterKind::Ollama, _) => "start Ollama (`ollama serve`, or the app) at that address".into(),
                    (AdapterKind::OpenAi, _) => "start the model server (LM Studio: start the local server; \
                                                 llama.cpp: llama-server) at that address"
                        .into(),
                };
                Check::fail(&name, format!("{shown}: {call}: {failure}"), fix)
            }
        });
    }
}
