//! `iop-operator crds | node-bundle NAME`. The controller (`run`) lands with
//! the controller wiring; until then the subcommand does not exist.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use iop_operator::bundle;
use iop_operator::certs::PrivateKeyPem;

#[derive(Parser)]
#[command(name = "iop-operator", version, about = "Kubernetes operator for IOP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print every IOP CustomResourceDefinition as one multi-document YAML
    /// (`kubectl apply -f -` takes it).
    Crds,
    /// Write what a Mac needs to run `iop-node` into a directory: ca.pem,
    /// node.pem, node-key.pem and a ready node.yaml.
    NodeBundle(NodeBundleArgs),
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
    /// CA certificate (PEM), e.g. key `ca.pem` of Secret `iop-node-NAME`.
    #[arg(long)]
    ca: PathBuf,
    /// Node certificate (PEM), key `node.pem` of Secret `iop-node-NAME`.
    #[arg(long)]
    cert: PathBuf,
    /// Node private key (PKCS#8 PEM), key `node-key.pem` of Secret `iop-node-NAME`.
    #[arg(long)]
    key: PathBuf,
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crds => {
            print!("{}", iop_operator::crd::render_yaml());
            ExitCode::SUCCESS
        }
        Command::NodeBundle(args) => match node_bundle(&args) {
            Ok(message) => {
                println!("{message}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("iop-operator node-bundle: {message}");
                ExitCode::FAILURE
            }
        },
    }
}

fn node_bundle(args: &NodeBundleArgs) -> Result<String, String> {
    let read = |flag: &str, path: &Path| {
        std::fs::read_to_string(path).map_err(|e| format!("--{flag} {}: {e}", path.display()))
    };
    let ca_pem = read("ca", &args.ca)?;
    let cert_pem = read("cert", &args.cert)?;
    let key = PrivateKeyPem::new(read("key", &args.key)?);
    let input = bundle::Input {
        node: &args.name,
        edge_url: &args.edge_url,
        server_name: args.server_name.as_deref(),
        ca_pem: &ca_pem,
        cert_pem: &cert_pem,
        key: &key,
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
