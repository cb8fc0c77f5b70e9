use super::*;
use crate::core::health::Source;
use iop_proto::pb::{FailureKind, ProviderHealth};

fn ev(source: Source, generation: u64, current: u64, sequence: u64, health: ProviderHealth) -> Evidence {
    Evidence { source, generation, current_generation: Some(current), sequence: Some(sequence), health }
}

use ProviderHealth::{Available, Unavailable, Unknown};

/// Issue 28 item 5: a reset or a cut is recorded under its own source,
/// never as a stall; a failure without the node's probe records nothing.
#[test]
fn each_run_failure_records_under_its_own_source() {
    let with = |kind: FailureKind, health: ProviderHealth| {
        let mut f = pb::ExecutionFailure::new(kind, "x");
        f.provider_health = health.into();
        f
    };
    assert_eq!(evidence_source(&with(FailureKind::ResponseStalled, Available)), Some(Source::Stall));
    assert_eq!(evidence_source(&with(FailureKind::ProviderUnreachable, Unavailable)), Some(Source::Unreachable));
    assert_eq!(evidence_source(&with(FailureKind::ProviderStreamCut, Unavailable)), Some(Source::StreamCut));
    assert_eq!(evidence_source(&with(FailureKind::ProviderStreamCut, ProviderHealth::Unspecified)), None);
    assert_eq!(evidence_source(&with(FailureKind::ProviderHttpStatus, Unavailable)), None);
    assert_eq!(Source::StreamCut.label(), "stream_cut");
    // Like a stall, a cut only lowers.
    let o = HealthOverlay::default();
    assert_eq!(o.apply("p", ev(Source::Readiness, 1, 1, 0, Available)), Applied::Recovered);
    assert_eq!(o.apply("p", ev(Source::StreamCut, 1, 1, 1, Available)), Applied::Recorded);
    assert_eq!(o.apply("p", ev(Source::StreamCut, 1, 1, 2, Unavailable)), Applied::Lowered);
}

#[test]
fn readiness_and_probes_set_health_both_ways() {
    let o = HealthOverlay::default();
    assert_eq!(o.apply("p", ev(Source::Readiness, 1, 1, 0, Unavailable)), Applied::Lowered);
    assert_eq!(
        o.apply("p", ev(Source::Probe, 1, 1, 1, Available)),
        Applied::Recovered,
        "a provider down at connect returns"
    );
    assert_eq!(o.apply("p", ev(Source::Probe, 1, 1, 2, Unknown)), Applied::Unsettled);
    assert_eq!(o.get("p").unwrap().state, OverlayState::Unknown);
    assert_eq!(
        o.apply("p", ev(Source::Probe, 1, 1, 3, Unavailable)),
        Applied::Lowered,
        "an idle provider that went down leaves"
    );
    assert_eq!(o.apply("p", ev(Source::Probe, 1, 1, 4, Unavailable)), Applied::Recorded);
    assert_eq!(o.unavailable(), vec!["p".to_string()]);
}

#[test]
fn stalls_only_lower_and_capabilities_only_recover() {
    let o = HealthOverlay::default();
    assert_eq!(
        o.apply("p", ev(Source::Stall, 1, 1, 1, Available)),
        Applied::Ignored,
        "no readiness yet: nothing to keep"
    );
    assert_eq!(o.apply("p", ev(Source::Readiness, 1, 1, 0, Available)), Applied::Recovered);
    assert_eq!(
        o.apply("p", ev(Source::Stall, 1, 1, 1, Available)),
        Applied::Recorded,
        "a stalled request on a healthy provider does not lower it"
    );
    assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 2, Unknown)), Applied::Recorded);
    assert_eq!(o.get("p").unwrap().state, OverlayState::Available);
    assert_eq!(
        o.apply("p", ev(Source::Capabilities, 1, 1, 3, Unavailable)),
        Applied::Ignored,
        "an unavailable answer is a no-op"
    );
    assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 4, Unknown)), Applied::Ignored);
    assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 5, Available)), Applied::Ignored, "already available");
    assert_eq!(o.get("p").unwrap().sequence, 2, "ignored answers are not recorded");
    assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 6, Unavailable)), Applied::Lowered);
    assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 7, Available)), Applied::Recorded);
    assert_eq!(o.get("p").unwrap().state, OverlayState::Unavailable, "stall evidence never recovers");
    assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 8, Unknown)), Applied::Ignored);
    assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 9, Available)), Applied::Recovered);
    assert_eq!(o.unavailable(), Vec::<String>::new());
}

#[test]
fn evidence_about_one_provider_never_changes_another() {
    let o = HealthOverlay::default();
    for p in ["a", "b"] {
        o.apply(p, ev(Source::Readiness, 1, 1, 0, Available));
    }
    assert_eq!(o.apply("a", ev(Source::Stall, 1, 1, 1, Unavailable)), Applied::Lowered);
    assert_eq!(o.apply("b", ev(Source::Capabilities, 1, 1, 2, Unavailable)), Applied::Ignored);
    assert_eq!(o.get("b").unwrap().state, OverlayState::Available);
    assert_eq!(o.unavailable(), vec!["a".to_string()]);
}

#[test]
fn stale_generations_and_sequences_are_ignored() {
    let o = HealthOverlay::default();
    assert_eq!(o.apply("p", ev(Source::Stall, 1, 2, 9, Unavailable)), Applied::StaleGeneration);
    assert_eq!(o.get("p"), None);
    let mut unbound = ev(Source::Stall, 2, 2, 0, Unavailable);
    unbound.sequence = None;
    assert_eq!(o.apply("p", unbound), Applied::Unsequenced);
    assert_eq!(o.apply("p", ev(Source::Readiness, 2, 2, 0, Available)), Applied::Recovered);
    assert_eq!(o.apply("p", ev(Source::Stall, 2, 2, 5, Unavailable)), Applied::Lowered);
    assert_eq!(o.apply("p", ev(Source::Capabilities, 2, 2, 5, Available)), Applied::StaleSequence);
    assert_eq!(o.apply("p", ev(Source::Probe, 2, 2, 4, Available)), Applied::StaleSequence);
    assert_eq!(o.get("p").unwrap().state, OverlayState::Unavailable, "equal or older sequences change nothing");
    // A newer connection starts at readiness (observation 0), and is still newer.
    assert_eq!(o.apply("p", ev(Source::Readiness, 3, 3, 0, Available)), Applied::Recovered);
    let entry = o.get("p").unwrap();
    assert_eq!((entry.generation, entry.sequence, entry.state), (3, 0, OverlayState::Available));
}

#[test]
fn the_view_is_unknown_and_undispatchable_off_the_ready_connection() {
    let config = crate::testing::one_provider_config("n1");
    let provider = &config.providers[0];
    let registry = NodeRegistry::default();
    let o = HealthOverlay::default();
    let view = |o: &HealthOverlay| ProviderView::of(&registry, o, &CredentialHealth::default(), provider);
    let nowhere =
        ProviderView { health: OverlayState::Unknown, dispatchable_on: None, last_resort: false, credential: None };
    assert_eq!(view(&o), nowhere, "no session");
    let (control, _rx) = tokio::sync::mpsc::channel(1);
    registry.register("n1", crate::node::registry::Session::registered(7, control));
    o.apply("p", ev(Source::Readiness, 7, 7, 0, Unknown));
    assert_eq!(view(&o), nowhere, "registered, not ready");
    assert!(registry.mark_ready("n1", 7));
    assert_eq!(
        view(&o),
        ProviderView { health: OverlayState::Unknown, dispatchable_on: Some(7), last_resort: false, credential: None }
    );
    o.apply("p", ev(Source::Probe, 7, 7, 1, Unavailable));
    assert_eq!(
        view(&o),
        ProviderView { health: OverlayState::Unavailable, dispatchable_on: None, last_resort: false, credential: None }
    );
    o.apply("p", ev(Source::Probe, 7, 7, 2, Available));
    assert_eq!(
        view(&o),
        ProviderView {
            health: OverlayState::Available,
            dispatchable_on: Some(7),
            last_resort: false,
            credential: None
        }
    );
    let (control, _rx) = tokio::sync::mpsc::channel(1);
    registry.register("n1", crate::node::registry::Session::registered(8, control));
    assert!(registry.mark_ready("n1", 8));
    assert_eq!(view(&o), nowhere, "evidence of an older connection says nothing about this one");
}

/// `iop_edge_provider_health` is the state set of the effective health
/// (`ProviderView`, what the admin snapshot reports) of every configured
/// provider: it follows a connection and a probe, and loses a provider a
/// reload removed.
#[test]
fn provider_health_series_follow_the_view_and_the_config() {
    let mut config = crate::testing::one_provider_config("n1");
    let mut q = config.providers[0].clone();
    q.id = "q".into();
    config.providers.push(q);
    let registry = NodeRegistry::default();
    let o = HealthOverlay::default();
    let metrics = EdgeMetrics::new();
    let series = |metrics: &EdgeMetrics| -> Vec<String> {
        let text = metrics.encode();
        let mut lines: Vec<String> =
            text.lines().filter(|l| l.starts_with("iop_edge_provider_health{")).map(str::to_string).collect();
        lines.sort();
        lines
    };
    let state_set = |current: &[(&str, &str)]| -> Vec<String> {
        let mut lines: Vec<String> = current
            .iter()
            .flat_map(|(provider, now)| {
                ["available", "unavailable", "unknown"].map(|health| {
                    let value = i64::from(health == *now);
                    format!("iop_edge_provider_health{{provider=\"{provider}\",health=\"{health}\"}} {value}")
                })
            })
            .collect();
        lines.sort();
        lines
    };
    // Publishes, and checks the series against the view the admin
    // snapshot reports.
    let publish = |providers: &[ProviderEntry]| {
        publish_health(&metrics, &registry, &o, &CredentialHealth::default(), providers);
        let views: Vec<(&str, &str)> = providers
            .iter()
            .map(|p| (p.id.as_str(), ProviderView::of(&registry, &o, &CredentialHealth::default(), p).health.label()))
            .collect();
        assert_eq!(series(&metrics), state_set(&views));
    };

    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "unknown"), ("q", "unknown")]), "no session");
    let (control, _rx) = tokio::sync::mpsc::channel(1);
    registry.register("n1", crate::node::registry::Session::registered(7, control));
    o.apply("p", ev(Source::Readiness, 7, 7, 0, Available));
    o.apply("q", ev(Source::Readiness, 7, 7, 0, Unavailable));
    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "unknown"), ("q", "unknown")]), "registered, not ready");
    assert!(registry.mark_ready("n1", 7));
    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "available"), ("q", "unavailable")]));
    o.apply("p", ev(Source::Probe, 7, 7, 1, Unavailable));
    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "unavailable"), ("q", "unavailable")]), "a probe lowered p");
    config.providers.retain(|p| p.id == "p");
    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "unavailable")]), "a reload removed q");
    registry.remove("n1", 7);
    publish(&config.providers);
    assert_eq!(series(&metrics), state_set(&[("p", "unknown")]), "its node left");
}

#[test]
fn concurrent_evidence_applies_each_sequence_once() {
    let o = Arc::new(HealthOverlay::default());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let o = o.clone();
            std::thread::spawn(move || {
                (1..=500u64)
                    .filter(|seq| {
                        o.apply("p", ev(Source::Stall, 1, 1, seq * 4 + t, Unavailable)) != Applied::StaleSequence
                    })
                    .count()
            })
        })
        .collect();
    let applied: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(applied >= 500, "the newest sequence of each round is applied");
    assert_eq!(o.get("p").unwrap().sequence, 2003, "the overlay ends at the highest sequence");
}
