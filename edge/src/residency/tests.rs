use super::*;
use crate::core::residency::{MAX_LOAD_MS, first_byte_timeout_ms};
use crate::node::registry::Session;
use crate::testing::two_nodes as config;

fn report(id: &str, residency: i32, last_load_ms: u64) -> pb::ProviderResidency {
    pb::ProviderResidency {
        provider_id: id.into(),
        residency,
        size_bytes: 40 << 30,
        vram_bytes: 39 << 30,
        last_load_ms,
        last_loaded_at_unix_ms: if last_load_ms > 0 { 1_700_000_000_000 } else { 0 },
        continues_prefill: true,
        context_window: 8192,
        prefill_ms_per_1k_tokens: 0,
        learned_stall_ms: 0,
        image_input: pb::ImageInput::Refused.into(),
    }
}

fn cold(last_load_ms: u64) -> Figures {
    Figures { residency: Residency::NotLoaded, last_load_ms, ..Figures::UNKNOWN }
}

/// A registry where node `n1` registered on connection 5 (not yet Ready);
/// the receiver is its control stream, kept while the test runs.
fn n1_registered_on_5() -> (NodeRegistry, tokio::sync::mpsc::Receiver<Result<pb::EdgeToNode, tonic::Status>>) {
    let registry = NodeRegistry::default();
    let (control, rx) = tokio::sync::mpsc::channel(1);
    registry.register("n1", Session::registered(5, control));
    (registry, rx)
}

const LOADED: i32 = pb::ModelResidency::Loaded as i32;
const NOT_LOADED: i32 = pb::ModelResidency::NotLoaded as i32;

#[test]
fn only_the_nodes_own_providers_named_once_with_a_known_residency_count() {
    let check = |entries: &[pb::ProviderResidency]| check_report(&config(), "n1", entries);
    let kept = check(&[report("a", LOADED, 0)]);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].0, "a");
    assert_eq!(
        kept[0].1,
        Figures {
            residency: Residency::Loaded,
            size_bytes: 40 << 30,
            vram_bytes: 39 << 30,
            last_load_ms: 0,
            last_loaded_at_unix_ms: 0,
            continues_prefill: true,
            context_window: 8192,
            prefill_ms_per_1k_tokens: 0,
            learned_stall_ms: 0,
            images: Some(false),
        }
    );
    let rejected = [
        report("b", LOADED, 0),  // another node's provider: a hostile node
        report("zz", LOADED, 0), // unknown
        report("", LOADED, 0),
        report("a", 0, 0),  // unspecified
        report("a", 77, 0), // unknown enum value
    ];
    for r in rejected {
        assert!(check(std::slice::from_ref(&r)).is_empty(), "{r:?}");
    }
    assert!(check(&[report("a", LOADED, 0), report("a", NOT_LOADED, 0)]).is_empty(), "named twice: ambiguous");
    let unknown = check(&[report("a", pb::ModelResidency::Unknown.into(), 0)]);
    assert_eq!(unknown[0].1.residency, Residency::Unknown);
}

#[test]
fn an_absurd_load_time_is_ignored_and_the_rest_kept() {
    let kept = check_report(&config(), "n1", &[report("a", NOT_LOADED, MAX_LOAD_MS + 1)]);
    assert_eq!(
        (kept[0].1.residency, kept[0].1.last_load_ms, kept[0].1.last_loaded_at_unix_ms),
        (Residency::NotLoaded, 0, 0)
    );
    assert_eq!(kept[0].1.size_bytes, 40 << 30);
    let kept = check_report(&config(), "n1", &[report("a", NOT_LOADED, MAX_LOAD_MS)]);
    assert_eq!(kept[0].1.last_load_ms, MAX_LOAD_MS, "an hour is the longest believed");
}

#[test]
fn first_byte_extension_table() {
    let loaded = Figures { residency: Residency::Loaded, last_load_ms: 20_000, ..Figures::UNKNOWN };
    let unknown = Figures { last_load_ms: 20_000, ..Figures::UNKNOWN };
    let rows: [(u64, Figures, u64); 9] = [
        (0, Figures::UNKNOWN, 0),                // nothing known: as configured
        (0, loaded, 0),                          // loaded: no load to wait for
        (0, unknown, 0),                         // unknown pays nothing
        (0, cold(0), 0),                         // cold, but no load measured
        (0, cold(20_000), 80_000),               // default 60 s + the load
        (5_000, cold(20_000), 25_000),           // configured + the load
        (30_000, loaded, 30_000),                // configured kept
        (3_000_000, cold(900_000), MAX_LOAD_MS), // capped at the node's range
        (0, cold(MAX_LOAD_MS), MAX_LOAD_MS),
    ];
    for (configured, figures, expected) in rows {
        assert_eq!(first_byte_timeout_ms(configured, &figures), expected, "{configured} {figures:?}");
        assert!(iop_proto::liveness::first_byte_timeout(expected).is_ok(), "the node accepts {expected}");
    }
}

/// A report counts from the current connection only; an entry is read
/// while that connection is Ready; a hostile node cannot set another
/// node's provider; a new connection starts unknown.
#[test]
fn reports_are_bound_to_the_nodes_current_ready_connection() {
    let config = config();
    let (registry, _control) = n1_registered_on_5();
    let table = ResidencyTable::default();
    let a = &config.providers[0];
    let b = &config.providers[1];
    assert_eq!(table.apply(&config, &registry, "n1", 5, &[report("a", LOADED, 0)]), 1);
    assert_eq!(table.of(&registry, a).residency, Residency::Unknown, "registered, not Ready yet");
    assert!(registry.mark_ready("n1", 5));
    assert_eq!(table.of(&registry, a).residency, Residency::Loaded);
    assert_eq!(table.on("a", 5).residency, Residency::Loaded);
    assert_eq!(table.on("a", 4).residency, Residency::Unknown, "another connection's lease");

    assert_eq!(table.apply(&config, &registry, "n1", 4, &[report("a", NOT_LOADED, 0)]), 0, "fenced generation");
    assert_eq!(table.of(&registry, a).residency, Residency::Loaded);

    let (control, _rx2) = tokio::sync::mpsc::channel(1);
    registry.register("n2", Session::registered(9, control));
    assert!(registry.mark_ready("n2", 9));
    assert_eq!(table.apply(&config, &registry, "n1", 5, &[report("b", NOT_LOADED, 0)]), 0, "not n1's provider");
    assert_eq!(table.of(&registry, b).residency, Residency::Unknown);

    assert!(registry.remove("n1", 5));
    assert_eq!(table.of(&registry, a).residency, Residency::Unknown, "the session ended");
    let (control, _rx3) = tokio::sync::mpsc::channel(1);
    registry.register("n1", Session::registered(6, control));
    assert!(registry.mark_ready("n1", 6));
    assert_eq!(table.of(&registry, a).residency, Residency::Unknown, "the old connection's report is gone");

    table.retain(|id| id != "a");
    assert_eq!(table.on("a", 5).residency, Residency::Unknown);
}

/// A broken stream is continued on a provider as its config says, else as
/// its node detected the server on its Ready connection (unknown: no).
#[test]
fn continuation_follows_the_config_then_the_nodes_detection() {
    let config = config();
    let (registry, _control) = n1_registered_on_5();
    let table = ResidencyTable::default();
    let a = config.providers[0].clone();
    assert!(!table.continues(&registry, &a), "nothing detected yet");
    table.apply(&config, &registry, "n1", 5, &[report("a", LOADED, 0)]);
    assert!(!table.continues(&registry, &a), "not Ready yet");
    assert!(registry.mark_ready("n1", 5));
    assert!(table.continues(&registry, &a), "the node detected a server that continues");
    let off = ProviderEntry { continuation: Some(false), ..a.clone() };
    assert!(!table.continues(&registry, &off), "the config turned it off");
    let silent = pb::ProviderResidency { continues_prefill: false, ..report("a", LOADED, 0) };
    table.apply(&config, &registry, "n1", 5, &[silent]);
    assert!(!table.continues(&registry, &a), "a server that cannot is never asked");
    let declared = ProviderEntry { continuation: Some(true), ..a };
    assert!(table.continues(&registry, &declared), "declared for a server the node cannot detect");
}

/// Whether a provider reads images: its config's declaration first, else
/// what its server said on its Ready connection; an unknown value on the
/// wire is unknown, not a refusal.
#[test]
fn image_input_follows_the_config_then_the_server() {
    let config = config();
    let (registry, _control) = n1_registered_on_5();
    let table = ResidencyTable::default();
    let a = config.providers[0].clone();
    assert_eq!(table.accepts_images(&registry, &a), None, "nothing said yet");
    table.apply(&config, &registry, "n1", 5, &[report("a", LOADED, 0)]);
    assert_eq!(table.accepts_images(&registry, &a), None, "not Ready yet");
    assert!(registry.mark_ready("n1", 5));
    assert_eq!(table.accepts_images(&registry, &a), Some(false), "its server reads text only");
    let declared = ProviderEntry { accepts_images: Some(true), ..a.clone() };
    assert_eq!(table.accepts_images(&registry, &declared), Some(true), "the declaration wins");
    for (said, believed) in
        [(pb::ImageInput::Accepted as i32, Some(true)), (pb::ImageInput::Unknown as i32, None), (99, None)]
    {
        table.apply(
            &config,
            &registry,
            "n1",
            5,
            &[pb::ProviderResidency { image_input: said, ..report("a", LOADED, 0) }],
        );
        assert_eq!(table.accepts_images(&registry, &a), believed, "{said}");
    }
}

/// `iop_edge_provider_residency`: a state set per configured provider;
/// the series of a provider a reload removed go at the next scrape.
#[test]
fn the_metric_is_a_state_set_of_the_configured_providers() {
    let config = config();
    let (registry, _control) = n1_registered_on_5();
    assert!(registry.mark_ready("n1", 5));
    let table = ResidencyTable::default();
    table.apply(&config, &registry, "n1", 5, &[report("a", NOT_LOADED, 0)]);
    let metrics = crate::metrics::EdgeMetrics::new();
    let lines = || {
        let text = metrics.encode();
        let mut lines: Vec<String> =
            text.lines().filter(|l| l.starts_with("iop_edge_provider_residency{")).map(str::to_string).collect();
        lines.sort();
        lines
    };
    publish(&metrics, &registry, &table, &config.providers);
    assert_eq!(
        lines(),
        [
            r#"iop_edge_provider_residency{provider="a",state="loaded"} 0"#,
            r#"iop_edge_provider_residency{provider="a",state="not_loaded"} 1"#,
            r#"iop_edge_provider_residency{provider="a",state="unknown"} 0"#,
            r#"iop_edge_provider_residency{provider="b",state="loaded"} 0"#,
            r#"iop_edge_provider_residency{provider="b",state="not_loaded"} 0"#,
            r#"iop_edge_provider_residency{provider="b",state="unknown"} 1"#,
        ]
    );
    publish(&metrics, &registry, &table, &config.providers[..1]);
    assert_eq!(lines().len(), 3, "b's series went with it: {:?}", lines());
}
