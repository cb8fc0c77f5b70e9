//! `iop-edge pki`: the certificates of an Edge without Kubernetes
//! (docs/standalone.md), made by the operator's own certificate code
//! (`iop_pki`). One directory holds the CA and the Edge's server
//! certificate, under the names the Edge config points at:
//!
//! - `ca.pem`, `ca-key.pem` (0600): the CA. The Edge trusts node
//!   certificates it signed, and nodes trust it for the Edge's.
//! - `edge.pem`, `edge-key.pem` (0600): the Edge's server certificate.
//!
//! [`init`] makes both (never over an existing CA unless forced),
//! [`renew_edge`] issues the server certificate again, and [`node`] writes
//! a node bundle in the format of `iop-operator node-bundle`. Nothing is
//! written before every input was checked, and no private key is printed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use iop_pki::bundle::{self, Bundle, BundleError};
use iop_pki::files::{self, Access};
use iop_pki::{CA_CERT_FILE, CA_KEY_FILE, Ca, CertError, EDGE_CERT_FILE, EDGE_KEY_FILE, PrivateKeyPem};
use iop_proto::identity::{IdentityError, NodeIdentity};
use time::OffsetDateTime;

/// Common name of the CA `iop-edge pki init` generates.
pub const CA_COMMON_NAME: &str = "iop edge CA";

/// Where `iop-edge pki node` writes a bundle without `--out`: `nodes/NAME`
/// in the PKI directory.
pub const NODES_DIR: &str = "nodes";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error(
        "{path} exists: {dir} already holds a CA, which the Edge and its nodes trust. Renew only the Edge's \
         certificate with `iop-edge pki edge {dir}`, or pass --force to replace the CA (every node then needs a \
         new bundle)"
    )]
    CaExists { dir: String, path: String },
    #[error("no CA in {dir}: cannot read {path}: {source} (make one with `iop-edge pki init {dir} --name HOST`)")]
    NoCa { dir: String, path: String, source: std::io::Error },
    #[error("the CA in {dir}: {source}")]
    BadCa { dir: String, source: CertError },
    #[error("no --name given, and the names of {path} cannot be read: {reason}")]
    NoNames { path: String, reason: String },
    #[error("--name: {0}")]
    Name(CertError),
    #[error("{0}")]
    Certificate(CertError),
    #[error("--trust-domain: {0}")]
    TrustDomain(IdentityError),
    #[error("node name: {0}")]
    NodeName(IdentityError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

fn issue_error(e: CertError) -> PkiError {
    match e {
        CertError::InvalidName(_) => PkiError::Name(e),
        other => PkiError::Certificate(other),
    }
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Write { path: path.display().to_string(), source }
}

/// What `init` or `renew_edge` issued.
#[derive(Debug)]
pub struct Issued {
    pub written: Vec<PathBuf>,
    pub ca_not_after: OffsetDateTime,
    /// The Edge certificate's names and notAfter.
    pub names: Vec<String>,
    pub edge_not_after: OffsetDateTime,
}

/// `iop-edge pki init DIR --name HOST...`.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// DNS names or IP addresses the nodes dial the Edge at.
    pub names: Vec<String>,
    pub ca_validity: Duration,
    pub edge_validity: Duration,
    /// Replace a CA that is there already.
    pub force: bool,
}

/// Creates `dir` (0700, if missing), a CA and the Edge's server certificate
/// for `names` in it. An existing CA (either of its files) is an error
/// unless `force`: replacing it cuts off every node until it has a new
/// bundle.
pub fn init(dir: &Path, options: &InitOptions, now: OffsetDateTime) -> Result<Issued, PkiError> {
    let ca = Ca::generate(CA_COMMON_NAME, now, options.ca_validity).map_err(issue_error)?;
    let edge = ca.edge_server_cert(&options.names, now, options.edge_validity).map_err(issue_error)?;
    let exists = |file| {
        let path = dir.join(file);
        match path.symlink_metadata() {
            Ok(_) => Err(PkiError::CaExists { dir: dir.display().to_string(), path: path.display().to_string() }),
            Err(_) => Ok(()),
        }
    };
    if !options.force {
        exists(CA_KEY_FILE)?;
        exists(CA_CERT_FILE)?;
    }
    files::create_private_dir(dir).map_err(write_error(dir))?;
    let ca_key = ca.key_pem();
    let ca_files = [(CA_KEY_FILE, ca_key.expose(), Access::Private), (CA_CERT_FILE, ca.cert_pem(), Access::Public)];
    let mut written = Vec::new();
    for (file, contents, access) in ca_files {
        let path = dir.join(file);
        let result = if options.force {
            files::write(&path, contents, access)
        } else {
            // Exclusive: a CA that appeared since the check above is kept.
            files::write_new(&path, contents, access)
        };
        match result {
            Ok(()) => written.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => exists(file)?,
            Err(e) => return Err(write_error(&path)(e)),
        }
    }
    written.extend(write_edge(dir, &edge)?);
    Ok(Issued {
        written,
        ca_not_after: ca.not_after(),
        names: options.names.clone(),
        edge_not_after: not_after(&edge)?,
    })
}

fn not_after(cert: &iop_pki::CertifiedKey) -> Result<OffsetDateTime, PkiError> {
    iop_pki::inspect(&cert.cert_pem).map(|info| info.not_after).map_err(PkiError::Certificate)
}

/// The key first: a reload that sees the new certificate with the old key
/// is rejected and tried again; the pair never stays mismatched.
fn write_edge(dir: &Path, edge: &iop_pki::CertifiedKey) -> Result<Vec<PathBuf>, PkiError> {
    let parts =
        [(EDGE_KEY_FILE, edge.key.expose(), Access::Private), (EDGE_CERT_FILE, edge.cert_pem.as_str(), Access::Public)];
    parts
        .into_iter()
        .map(|(file, contents, access)| {
            let path = dir.join(file);
            files::write(&path, contents, access).map_err(write_error(&path))?;
            Ok(path)
        })
        .collect()
}

/// The CA of a PKI directory, checked (a CA, current, its key).
pub fn load_ca(dir: &Path, now: OffsetDateTime) -> Result<Ca, PkiError> {
    let read = |file| {
        let path = dir.join(file);
        std::fs::read_to_string(&path).map_err(|source| PkiError::NoCa {
            dir: dir.display().to_string(),
            path: path.display().to_string(),
            source,
        })
    };
    let cert = read(CA_CERT_FILE)?;
    let key = PrivateKeyPem::new(read(CA_KEY_FILE)?);
    Ca::from_pem(&cert, &key, now).map_err(|source| PkiError::BadCa { dir: dir.display().to_string(), source })
}

/// `iop-edge pki edge DIR [--name HOST...]`: the Edge's server certificate
/// again, from the CA in `dir`, for `names` or (none given) the names of
/// the current `edge.pem`. The Edge reloads it by itself (its TLS files
/// are watched like its config); nodes need nothing, they trust the CA.
pub fn renew_edge(dir: &Path, names: &[String], validity: Duration, now: OffsetDateTime) -> Result<Issued, PkiError> {
    let ca = load_ca(dir, now)?;
    let names = if names.is_empty() {
        let path = dir.join(EDGE_CERT_FILE);
        let no_names = |reason: String| PkiError::NoNames { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(&path).map_err(|e| no_names(e.to_string()))?;
        let names = iop_pki::inspect(&text).map_err(|e| no_names(e.to_string()))?.names;
        if names.is_empty() {
            return Err(no_names("it has no DNS name or IP address".to_string()));
        }
        names
    } else {
        names.to_vec()
    };
    let edge = ca.edge_server_cert(&names, now, validity).map_err(issue_error)?;
    let written = write_edge(dir, &edge)?;
    Ok(Issued { written, ca_not_after: ca.not_after(), names, edge_not_after: not_after(&edge)? })
}

/// `iop-edge pki node NAME --dir DIR --edge-url URL`.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub name: String,
    /// The Edge's node-facing gRPC endpoint, `https://HOST[:PORT]`.
    pub edge_url: String,
    /// Name on the Edge's certificate when it differs from the URL's host.
    pub server_name: Option<String>,
    /// The Edge config's `trust_domain`.
    pub trust_domain: String,
    pub validity: Duration,
    /// Default: `DIR/nodes/NAME`.
    pub out: Option<PathBuf>,
}

/// A node bundle written by [`node`].
#[derive(Debug)]
pub struct NodeBundle {
    pub bundle: Bundle,
    pub out: PathBuf,
    pub written: Vec<PathBuf>,
}

/// Issues a node certificate from the CA in `dir` and writes the node's
/// bundle (replacing one that is there: renewal is running it again).
pub fn node(dir: &Path, options: &NodeOptions, now: OffsetDateTime) -> Result<NodeBundle, PkiError> {
    iop_proto::identity::validate_trust_domain(&options.trust_domain).map_err(PkiError::TrustDomain)?;
    let identity = NodeIdentity::new(&options.trust_domain, &options.name).map_err(PkiError::NodeName)?;
    let ca = load_ca(dir, now)?;
    let cert = ca.node_client_cert(&identity, now, options.validity).map_err(issue_error)?;
    let written_by = format!("iop-edge pki node {}", options.name);
    let input = bundle::Input {
        node: &options.name,
        edge_url: &options.edge_url,
        server_name: options.server_name.as_deref(),
        ca_pem: ca.cert_pem(),
        cert_pem: &cert.cert_pem,
        key: &cert.key,
        written_by: &written_by,
    };
    let bundle = bundle::build(&input, now)?;
    let out = options.out.clone().unwrap_or_else(|| dir.join(NODES_DIR).join(&options.name));
    let written = bundle.write(&out)?;
    Ok(NodeBundle { bundle, out, written })
}

/// A time as RFC 3339, whole seconds (`2027-01-04T09:25:20Z`).
fn rfc3339(at: OffsetDateTime) -> String {
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| at.to_string())
}

/// `path` made absolute for display (as it is when it cannot be).
fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

fn file_names(paths: &[PathBuf]) -> String {
    paths.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
}

/// What `iop-edge pki init` and `pki edge` print.
pub fn issued_report(dir: &Path, issued: &Issued) -> String {
    let dir = absolute(dir);
    format!(
        "wrote {} in {}\n\
         the Edge's certificate is for {} and valid until {}; the CA is valid until {}\n\
         the Edge config points at them:\n  \
         tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
        file_names(&issued.written),
        dir.display(),
        issued.names.join(", "),
        rfc3339(issued.edge_not_after),
        rfc3339(issued.ca_not_after),
        dir.join(CA_CERT_FILE).display(),
        dir.join(EDGE_CERT_FILE).display(),
        dir.join(EDGE_KEY_FILE).display(),
    )
}

/// What `iop-edge pki node` prints: what it wrote, and the entry the Edge
/// config needs to admit the node.
pub fn node_report(written: &NodeBundle) -> String {
    let identity = &written.bundle.identity;
    let out = absolute(&written.out);
    let copy = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| ".".into());
    format!(
        "wrote {} in {} for {identity} (certificate valid until {})\n\
         the Edge admits this node when its config has (it reloads on a change, or at once on SIGHUP):\n  \
         trust_domain: {}\n  \
         nodes:\n    - name: {}\n\
         copy the directory to the Mac (it holds the node's private key) and there run:\n  \
         iop-node --config {copy}/{}\n",
        file_names(&written.written),
        out.display(),
        rfc3339(written.bundle.not_after),
        identity.trust_domain,
        identity.name,
        bundle::CONFIG_FILE,
    )
}

#[cfg(test)]
mod tests;
