//! `iop-operator run | crds | node-bundle NAME | ca rotate | ca finish`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use iop_operator::env::RunConfig;
use iop_operator::runtime;
use iop_pki::{PrivateKeyPem, bundle};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "iop-operator", version, about = "Kubernetes operator for IOP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller in the cluster. Settings come from the environment
    /// the Helm chart sets: IOP_NAMESPACE, IOP_POD_NAME, IOP_EDGE_POD_SELECTOR,
    /// IOP_EDGE_SERVER_NAMES, IOP_TRUST_DOMAIN, IOP_METRICS_ADDR (optional,
    /// default 0.0.0.0:9464: /metrics, /healthz, /readyz) and RUST_LOG.
    Run,
    /// Print every IOP CustomResourceDefinition as one multi-document YAML
    /// (`kubectl apply -f -` takes it).
    Crds,
    /// Write what a Mac needs to run `iop-node` into a directory: ca.pem,
    /// node.pem, node-key.pem and a ready node.yaml.
    NodeBundle(NodeBundleArgs),
    /// Replace the CA in Secret `iop-ca` with an overlap: `ca rotate` makes
    /// a new CA the signer while the old one stays trusted (nodes keep
    /// working on their old bundles); `ca finish` ends the overlap once
    /// every node runs a new bundle.
    #[command(subcommand)]
    Ca(CaCommand),
}

#[derive(Subcommand)]
enum CaCommand {
    /// Make a new CA (or the one given) the signer; the current CA stays
    /// trusted until `ca finish`.
    Rotate(RotateArgs),
    /// End the overlap: the old CA is trusted no more. Refused while a
    /// NodeCatalog's node does not run a bundle of the new CA.
    Finish(FinishArgs),
}

#[derive(Args)]
struct RotateArgs {
    /// The namespace of the operator (and of Secret `iop-ca`).
    #[arg(long, short = 'n')]
    namespace: String,
    /// Your new CA certificate (PEM) instead of a generated one.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Its private key (PKCS#8 PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
}

#[derive(Args)]
struct FinishArgs {
    /// The namespace of the operator (and of Secret `iop-ca`).
    #[arg(long, short = 'n')]
    namespace: String,
    /// Finish although some nodes do not run a bundle of the new CA: they
    /// are cut off.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct NodeBundleArgs {
    /// The node's name (its NodeCatalog's name).
    name: String,
    /// The Edge's node-facing gRPC endpoint, https://HOST[:PORT].
    #[arg(long)]
    edge_url: String,
    /// Name on the Edge's certificate, when it differs from the URL's host.
    #[arg(long)]
    server_name: Option<String>,
    /// Read ca.pem, node.pem and node-key.pem from Secret `iop-node-NAME` in
    /// this namespace (kubeconfig or in-cluster credentials), instead of
    /// --ca/--cert/--key.
    #[arg(long, short = 'n', conflicts_with_all = ["ca", "cert", "key"])]
    namespace: Option<String>,
    /// CA certificate (PEM), e.g. key `ca.pem` of Secret `iop-node-NAME`.
    #[arg(long, required_unless_present = "namespace")]
    ca: Option<PathBuf>,
    /// Node certificate (PEM), key `node.pem` of Secret `iop-node-NAME`.
    #[arg(long, required_unless_present = "namespace")]
    cert: Option<PathBuf>,
    /// Node private key (PKCS#8 PEM), key `node-key.pem` of Secret `iop-node-NAME`.
    #[arg(long, required_unless_present = "namespace")]
    key: Option<PathBuf>,
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run => run(),
        Command::Crds => {
            print!("{}", iop_operator::crd::render_yaml());
            ExitCode::SUCCESS
        }
        Command::NodeBundle(args) => report("node-bundle", node_bundle(&args)),
        Command::Ca(CaCommand::Rotate(args)) => report("ca rotate", rotate(&args)),
        Command::Ca(CaCommand::Finish(args)) => {
            let (namespace, force) = (args.namespace.clone(), args.force);
            report(
                "ca finish",
                with_client(|client| async move {
                    runtime::pki::finish_rotation(client, &namespace, force, time::OffsetDateTime::now_utc()).await
                }),
            )
        }
    }
}

fn report(command: &str, outcome: Result<String, String>) -> ExitCode {
    match outcome {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("iop-operator {command}: {message}");
            ExitCode::FAILURE
        }
    }
}

fn rotate(args: &RotateArgs) -> Result<String, String> {
    let now = time::OffsetDateTime::now_utc();
    let new = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => {
            let read = |flag: &str, path: &PathBuf| {
                std::fs::read_to_string(path).map_err(|e| format!("--{flag} {}: {e}", path.display()))
            };
            let ca = iop_pki::Ca::from_pem(&read("cert", cert)?, &PrivateKeyPem::new(read("key", key)?), now)
                .map_err(|e| format!("--cert/--key: {e}"))?;
            Some(ca)
        }
        _ => None,
    };
    let namespace = args.namespace.clone();
    with_client(|client| async move { runtime::pki::rotate_ca(client, &namespace, new, now).await })
}

fn run() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        // kube's client logs a whole response body at WARN when it does not
        // decode; for a Secret that body holds private keys. Never let it print.
        .add_directive("kube_client::client=error".parse().expect("a valid directive"))
        // Its HTTP trace layer logs every failed request at ERROR (every 2 s
        // while the API server is away); the operator says it once per
        // change of state itself (leader election, watches).
        .add_directive("kube_client::client::builder=off".parse().expect("a valid directive"));
    // Logs go to stdout; colour codes only on a terminal (never in a pod's log).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let config = match RunConfig::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("iop-operator run: {e}");
            return ExitCode::from(2);
        }
    };
    // One crypto provider for every rustls user in the process (kube's client).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("iop-operator run: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let client = match runtime::client().await {
            Ok(client) => client,
            Err(e) => {
                tracing::error!(error = %e, "no Kubernetes API client (in-cluster config or KUBECONFIG)");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = CancellationToken::new();
        tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                wait_for_signal().await;
                tracing::info!("shutting down");
                shutdown.cancel();
            }
        });
        match runtime::run(config, client, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, kind = e.label(), "operator stopped");
                ExitCode::FAILURE
            }
        }
    })
}

/// Runs `call` with a Kubernetes API client (kubeconfig or in-cluster), for
/// the commands an administrator runs from their own machine.
fn with_client<T, F>(call: impl FnOnce(kube::Client) -> F) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let client = runtime::client()
            .await
            .map_err(|e| format!("no Kubernetes API client (kubeconfig or in-cluster config): {e}"))?;
        call(client).await
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn node_bundle(args: &NodeBundleArgs) -> Result<String, String> {
    let (ca_pem, cert_pem, key) = match &args.namespace {
        Some(namespace) => {
            with_client(|client| async move { runtime::pki::read_node_secret(client, namespace, &args.name).await })?
        }
        None => {
            let read = |flag: &str, path: &Option<PathBuf>| {
                let path = path.as_deref().ok_or_else(|| format!("--{flag} is required without --namespace"))?;
                std::fs::read_to_string(path).map_err(|e| format!("--{flag} {}: {e}", path.display()))
            };
            (read("ca", &args.ca)?, read("cert", &args.cert)?, PrivateKeyPem::new(read("key", &args.key)?))
        }
    };
    let written_by = format!("iop-operator node-bundle {}", args.name);
    let input = bundle::Input {
        node: &args.name,
        edge_url: &args.edge_url,
        server_name: args.server_name.as_deref(),
        ca_pem: &ca_pem,
        cert_pem: &cert_pem,
        key: &key,
        written_by: &written_by,
    };
    let bundle = bundle::build(&input, time::OffsetDateTime::now_utc()).map_err(|e| e.to_string())?;
    bundle.write(&args.out).map_err(|e| e.to_string())?;
    Ok(format!(
        "wrote {} for {} (certificate valid until {}); on the Mac: iop-node --config {}",
        args.out.display(),
        bundle.identity,
        bundle.not_after,
        args.out.join(bundle::CONFIG_FILE).display()
    ))
}
