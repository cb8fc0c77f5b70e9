//! `iop-edge --config FILE`: runs the Edge until SIGTERM/Ctrl-C.
//! `iop-edge new-key --name NAME` / `iop-edge hash-key`: API keys for the
//! keys file (docs/security.md "Keys").
//! `iop-edge pki init|edge|node`: certificates for an Edge without
//! Kubernetes (docs/standalone.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use iop_proto::liveness::HeartbeatProfile;

/// mimalloc rather than glibc malloc: per-request allocations were about a
/// tenth of the CPU under load (measured with `scripts/bench`, see
/// docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "iop-edge", version, about = "IOP Edge: LLM gateway that dispatches to nodes over mTLS gRPC")]
#[command(subcommand_negates_reqs = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Edge config file (YAML); see examples/edge.yaml.
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// How often to check the config file for changes (SIGHUP checks at once).
    #[arg(long, default_value_t = 2000)]
    reload_interval_ms: u64,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// Serve `POST /admin/v1/workspaces/{ref}/calls` on the admin listener:
    /// run workspace tool calls (within each workspace's template) directly,
    /// to check a workspace end to end. Off by default.
    #[arg(long)]
    admin_workspace_calls: bool,
    /// This replica's id, told to nodes (they keep one session with each
    /// replica the config's `replicas` lists). Default: the host name.
    #[arg(long, value_parser = parse_replica_id)]
    replica_id: Option<String>,
    /// At start, `/readyz` fails until every node of the config holds a
    /// ready session with this replica or this long passed (a config
    /// without nodes is ready at once); once ready, only draining fails it.
    #[arg(long, default_value_t = 30_000)]
    startup_grace_ms: u64,
    /// On SIGTERM, keep serving this long with `/readyz` failing, so load
    /// balancers stop sending new requests first (the chart sets 5000).
    #[arg(long, default_value_t = 0)]
    drain_delay_ms: u64,
    /// On SIGTERM, the longest wait (delay included) for the requests in
    /// flight to finish; keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, default_value_t = 25_000)]
    drain_timeout_ms: u64,
    /// Test-only heartbeat profile override, INTERVAL_MS,WAIT_MS.
    #[arg(long, hide = true, value_parser = HeartbeatProfile::parse_test_override)]
    test_heartbeat_profile: Option<HeartbeatProfile>,
    /// Test-only: seal every credential lease wrongly in this way.
    #[arg(long, hide = true, value_enum)]
    test_lease_fault: Option<iop_edge::credentials::LeaseFault>,
}

fn parse_replica_id(id: &str) -> Result<String, String> {
    iop_proto::config::is_replica_id(id)
        .then(|| id.to_string())
        .ok_or_else(|| "a replica id is 1-253 of [A-Za-z0-9-_.]".to_string())
}

#[derive(clap::Subcommand)]
enum Command {
    /// Generates a random API key; prints it once, with the keys-file entry
    /// that holds only its hash.
    NewKey {
        /// The principal's name in the keys file.
        #[arg(long)]
        name: String,
        /// The key stops being accepted this long from now (`90d`, `12h`;
        /// units s, m, h, d, w): its entry gets `expires_at`.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// Prints the SHA-256 (the keys file's `key_sha256`) of the API key read
    /// from stdin, so the key stays out of shell history.
    HashKey,
    /// Certificates for an Edge without Kubernetes: a CA, the Edge's server
    /// certificate and node bundles (docs/standalone.md).
    Pki {
        #[command(subcommand)]
        command: PkiCommand,
    },
}

/// Lifetimes take a number and a unit, as `new-key --expires-in` does.
fn lifetime(text: &str) -> Result<std::time::Duration, String> {
    let d = iop_edge::auth::parse_expires_in(text)?;
    Ok(std::time::Duration::from_secs(d.whole_seconds().unsigned_abs()))
}

#[derive(clap::Subcommand)]
enum PkiCommand {
    /// Creates DIR (0700) with a new CA (ca.pem, ca-key.pem) and the Edge's
    /// server certificate (edge.pem, edge-key.pem); the keys are 0600.
    /// Refuses to replace a CA that is there (see --force).
    Init {
        /// Directory to write into (created if missing).
        dir: PathBuf,
        /// A DNS name or IP address nodes dial the Edge at (the host of
        /// their --edge-url). Repeatable.
        #[arg(long = "name", value_name = "HOST", required = true)]
        names: Vec<String>,
        /// Lifetime of the CA (s, m, h, d, w).
        #[arg(long, default_value = "3650d", value_parser = lifetime)]
        ca_validity: std::time::Duration,
        /// Lifetime of the Edge's certificate.
        #[arg(long, default_value = "90d", value_parser = lifetime)]
        edge_validity: std::time::Duration,
        /// Replace a CA that is there. Every node certificate it signed
        /// stops working: each node needs a new bundle.
        #[arg(long)]
        force: bool,
    },
    /// Issues the Edge's server certificate again from the CA in DIR, for
    /// the names of the current one (or --name). The Edge reloads it.
    Edge {
        /// The directory `pki init` wrote.
        dir: PathBuf,
        /// A DNS name or IP address for the certificate; repeatable.
        /// Default: the names of the current edge.pem.
        #[arg(long = "name", value_name = "HOST")]
        names: Vec<String>,
        /// Lifetime of the certificate.
        #[arg(long, default_value = "90d", value_parser = lifetime)]
        validity: std::time::Duration,
    },
    /// Writes a node bundle (ca.pem, node.pem, node-key.pem, node.yaml: the
    /// format of `iop-operator node-bundle`) with a new certificate from the
    /// CA in --dir, and prints the Edge config entry that admits the node.
    Node {
        /// The node's name (its identity; the Edge config's `nodes[].name`).
        name: String,
        /// The directory `pki init` wrote.
        #[arg(long)]
        dir: PathBuf,
        /// The Edge's node-facing gRPC endpoint, https://HOST[:PORT].
        #[arg(long)]
        edge_url: String,
        /// Name on the Edge's certificate, when it differs from the URL's host.
        #[arg(long)]
        server_name: Option<String>,
        /// The Edge config's `trust_domain`.
        #[arg(long, default_value = "iop.local")]
        trust_domain: String,
        /// Lifetime of the node certificate.
        #[arg(long, default_value = "30d", value_parser = lifetime)]
        validity: std::time::Duration,
        /// Directory to write the bundle into. Default: DIR/nodes/NAME.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn pki_command(command: PkiCommand) -> ExitCode {
    use iop_edge::pki;
    let now = time::OffsetDateTime::now_utc();
    let (what, result) = match command {
        PkiCommand::Init { dir, names, ca_validity, edge_validity, force } => {
            let options = pki::InitOptions { names, ca_validity, edge_validity, force };
            ("init", pki::init(&dir, &options, now).map(|issued| pki::issued_report(&dir, &issued)))
        }
        PkiCommand::Edge { dir, names, validity } => {
            ("edge", pki::renew_edge(&dir, &names, validity, now).map(|issued| pki::issued_report(&dir, &issued)))
        }
        PkiCommand::Node { name, dir, edge_url, server_name, trust_domain, validity, out } => {
            let options = pki::NodeOptions { name, edge_url, server_name, trust_domain, validity, out };
            ("node", pki::node(&dir, &options, now).map(|written| pki::node_report(&written)))
        }
    };
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iop-edge pki {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn subcommand(command: Command) -> ExitCode {
    use iop_edge::auth::{sha256, to_hex};
    match command {
        Command::Pki { command } => return pki_command(command),
        Command::NewKey { name, expires_in } => {
            let expires_at = match expires_in.as_deref().map(iop_edge::auth::parse_expires_in).transpose() {
                Ok(d) => d.map(|d| {
                    let at =
                        (time::OffsetDateTime::now_utc() + d).replace_nanosecond(0).expect("0 is a valid nanosecond");
                    at.format(&time::format_description::well_known::Rfc3339).expect("an RFC 3339 time formats")
                }),
                Err(e) => {
                    eprintln!("iop-edge new-key --expires-in {e}");
                    return ExitCode::from(2);
                }
            };
            let mut secret = [0u8; 32];
            if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret).is_err() {
                eprintln!("iop-edge: the system random source failed");
                return ExitCode::from(1);
            }
            let key = format!("iop-{}", to_hex(&secret));
            let hash = to_hex(&sha256(key.as_bytes()));
            println!("API key (give it to the client; IOP keeps only its hash):\n  {key}");
            let expiry = expires_at.map(|at| format!(", expires_at: \"{at}\"")).unwrap_or_default();
            println!(
                "keys file entry (a new principal):\n  - {{ name: {name}, keys: [ {{ sha256: {hash}{expiry} }} ], models: [\"*\"] }}"
            );
            println!(
                "or, to rotate a key of the principal `{name}`, add to its `keys`:\n      - {{ sha256: {hash}{expiry} }}"
            );
        }
        Command::HashKey => {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
                eprintln!("iop-edge hash-key: pass the key on stdin, e.g. `printf %s \"$KEY\" | iop-edge hash-key`");
                return ExitCode::from(2);
            }
            println!("{}", to_hex(&sha256(line.trim().as_bytes())));
        }
    }
    ExitCode::SUCCESS
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config_path = match (args.command, args.config) {
        (Some(command), _) => return subcommand(command),
        (None, Some(path)) => path,
        (None, None) => unreachable!("clap requires --config without a subcommand"),
    };
    iop_edge::init_logging(args.log_json);
    iop_edge::install_crypto_provider();
    let config = match iop_edge::config::load(&config_path) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let ms = std::time::Duration::from_millis;
    let mut builder = iop_edge::Edge::builder(config)
        .heartbeat(args.test_heartbeat_profile.unwrap_or_default())
        .watch_config(config_path, ms(args.reload_interval_ms))
        .lifecycle(iop_edge::Lifecycle {
            startup_grace: ms(args.startup_grace_ms),
            drain_delay: ms(args.drain_delay_ms),
            drain_timeout: ms(args.drain_timeout_ms.max(args.drain_delay_ms)),
        });
    if args.admin_workspace_calls {
        builder = builder.admin_workspace_calls();
    }
    if let Some(id) = args.replica_id {
        builder = builder.replica_id(id);
    }
    if let Some(fault) = args.test_lease_fault {
        builder = builder.test_lease_fault(fault);
    }
    let edge = match builder.bind().await {
        Ok(edge) => edge,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(1);
        }
    };
    // One machine-readable line on stdout (tests and scripts wait for it).
    println!("iop-edge listening http={} grpc={} admin={}", edge.http_addr(), edge.grpc_addr(), edge.admin_addr());
    match edge.serve(iop_edge::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        <super::Args as clap::CommandFactory>::command().debug_assert();
    }

    /// `iop-edge pki`'s default lifetimes are the operator's.
    #[test]
    fn pki_defaults_are_the_operators() {
        use clap::Parser;
        let args = super::Args::parse_from(["iop-edge", "pki", "init", "dir", "--name", "edge.example.lan"]);
        let Some(super::Command::Pki { command: super::PkiCommand::Init { ca_validity, edge_validity, .. } }) =
            args.command
        else {
            panic!("pki init")
        };
        assert_eq!((ca_validity, edge_validity), (iop_pki::CA_VALIDITY, iop_pki::EDGE_VALIDITY));
        let args = super::Args::parse_from(["iop-edge", "pki", "edge", "dir"]);
        let Some(super::Command::Pki { command: super::PkiCommand::Edge { validity, .. } }) = args.command else {
            panic!("pki edge")
        };
        assert_eq!(validity, iop_pki::EDGE_VALIDITY);
        let args = super::Args::parse_from(["iop-edge", "pki", "node", "mac", "--dir", "d", "--edge-url", "https://e"]);
        let Some(super::Command::Pki { command: super::PkiCommand::Node { validity, trust_domain, .. } }) =
            args.command
        else {
            panic!("pki node")
        };
        assert_eq!(validity, iop_pki::NODE_VALIDITY);
        assert_eq!(trust_domain, "iop.local");
    }
}
