use super::*;

#[test]
fn residency_flags_parse_with_their_defaults() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        residency: ResidencyConfig,
    }
    use clap::Parser as _;
    assert_eq!(Cli::parse_from(["mock"]).residency, ResidencyConfig::default());
    assert!(ResidencyConfig::default().loaded, "resident by default");
    let cli = Cli::parse_from(["mock", "--loaded", "false", "--load-delay-ms", "250", "--residency-api", "llama_cpp"]);
    assert_eq!(
        cli.residency,
        ResidencyConfig { loaded: false, load_delay_ms: 250, residency_api: ResidencyApi::LlamaCpp }
    );
    for (name, api) in [
        ("all", ResidencyApi::All),
        ("ollama", ResidencyApi::Ollama),
        ("lm_studio", ResidencyApi::LmStudio),
        ("none", ResidencyApi::None),
    ] {
        assert_eq!(Cli::parse_from(["mock", "--residency-api", name]).residency.residency_api, api);
    }
    assert!(Cli::try_parse_from(["mock", "--loaded", "maybe"]).is_err());
    assert_eq!(base_model("mock@words=3,stall_after=1"), "mock");
    assert_eq!(base_model("llama3.2:3b"), "llama3.2:3b");
}
