//! `iop-mock-provider`: the deterministic mock LLM provider (Ollama + OpenAI
//! APIs) as a process. See `iop_e2e::mock_provider` for endpoints and knobs.
//!
//! Prints `iop-mock-provider listening on http://ADDR` on stdout once bound
//! (the actual port with `--listen 127.0.0.1:0`) and exits cleanly on
//! SIGTERM / Ctrl-C.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use iop_e2e::mock_provider::{self, Faults, MockConfig, ResidencyConfig, Scripts};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "iop-mock-provider",
    version,
    about = "Deterministic mock LLM provider speaking the Ollama and OpenAI APIs, with fault knobs"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, env = "IOP_MOCK_LISTEN", default_value = "127.0.0.1:11434")]
    listen: String,
    /// Default fault knobs for every chat request (the model suffix `@k=v,…`
    /// and the `x-mock-faults` header override them).
    #[command(flatten)]
    faults: Faults,
    /// Require `Authorization: Bearer KEY` on every API call (401 otherwise),
    /// like a keyed model server.
    #[arg(long, env = "IOP_MOCK_API_KEY")]
    api_key: Option<String>,
    /// YAML file of scripted turns: a request whose messages contain
    /// `iop-mock-script:NAME` gets the next turn of script NAME. Loaded once.
    #[arg(long, env = "IOP_MOCK_SCRIPT_FILE", value_name = "FILE")]
    script_file: Option<std::path::PathBuf>,
    /// Model residency (process state): `--loaded true|false`,
    /// `--load-delay-ms N`, `--residency-api all|ollama|llama_cpp|lm_studio|none`.
    #[command(flatten)]
    residency: ResidencyConfig,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let cli = Cli::parse();
    if let Err(e) = cli.faults.validate() {
        eprintln!("iop-mock-provider: {e}");
        return ExitCode::from(2);
    }
    let scripts = match cli.script_file.as_deref().map(Scripts::load).transpose() {
        Ok(scripts) => scripts,
        Err(e) => {
            eprintln!("iop-mock-provider: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&cli.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("iop-mock-provider: cannot listen on {}: {e}", cli.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("iop-mock-provider: no local address: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("iop-mock-provider listening on http://{addr}");
    let _ = std::io::stdout().flush();

    let config = MockConfig { defaults: cli.faults, api_key: cli.api_key, scripts, residency: cli.residency };
    match mock_provider::serve(listener, config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iop-mock-provider: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on Ctrl-C or (on Unix) SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM ({e}); Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
