use super::*;
use crate::node::registry::Session;
use tokio::sync::mpsc;

fn view(priority: u32, in_flight: u32, capacity: u32) -> CandidateView {
    CandidateView { priority, eligible: true, avoided: false, fallback_allowed: true, in_flight, capacity, cold: false }
}

fn no_rotation(_: u32, _: usize) -> usize {
    0
}

#[test]
fn fewest_in_flight_wins_within_the_best_group() {
    let c = [view(0, 2, 4), view(0, 1, 4), view(1, 0, 4)];
    assert_eq!(choose(&c, 4, no_rotation), Choice::Admit(1));
}

#[test]
fn ties_rotate_round_robin() {
    let c = [view(0, 1, 4), view(0, 1, 4), view(0, 3, 4)];
    let mut cursor = 0;
    let picks: Vec<_> = (0..4)
        .map(|_| {
            choose(&c, 4, |_, _| {
                cursor += 1;
                cursor - 1
            })
        })
        .collect();
    assert_eq!(picks, [Choice::Admit(0), Choice::Admit(1), Choice::Admit(0), Choice::Admit(1)]);
}

#[test]
fn a_full_group_spills_to_the_next_and_all_full_means_busy() {
    assert_eq!(choose(&[view(0, 4, 4), view(1, 3, 4)], 4, no_rotation), Choice::Admit(1));
    assert_eq!(choose(&[view(0, 4, 4), view(1, 4, 4)], 4, no_rotation), Choice::AllBusy);
}

#[test]
fn ineligible_and_avoided_providers() {
    let mut down = view(0, 0, 4);
    down.eligible = false;
    assert_eq!(choose(&[down], 4, no_rotation), Choice::NoneEligible);
    assert_eq!(choose(&[], 4, no_rotation), Choice::NoneEligible);
    let mut tried = view(0, 0, 4);
    tried.avoided = true;
    assert_eq!(choose(&[tried, view(1, 3, 4)], 4, no_rotation), Choice::Admit(1), "an alternative beats a tried one");
    assert_eq!(choose(&[tried, down], 4, no_rotation), Choice::Admit(0), "a tried one beats nothing");
    let mut tried_full = view(1, 4, 4);
    tried_full.avoided = true;
    assert_eq!(choose(&[view(0, 4, 4), tried_full], 4, no_rotation), Choice::AllBusy);
    let mut stalled = tried;
    stalled.fallback_allowed = false;
    assert_eq!(choose(&[stalled, down], 4, no_rotation), Choice::NoneEligible, "no fallback without clearance");
    assert_eq!(choose(&[stalled, view(1, 0, 4)], 4, no_rotation), Choice::Admit(1), "an alternate is preferred");
}

fn cold(priority: u32, in_flight: u32, capacity: u32) -> CandidateView {
    CandidateView { cold: true, ..view(priority, in_flight, capacity) }
}

/// Issue 29: the residency rule, with the default penalty 4 unless a row
/// says otherwise. `unknown` residency is `cold: false` (pays nothing).
#[test]
fn residency_table() {
    let rows: Vec<(&str, Vec<CandidateView>, u32, Choice)> = vec![
        ("loaded beats cold at equal load", vec![cold(0, 0, 8), view(0, 0, 8)], 4, Choice::Admit(1)),
        (
            "loaded with up to the penalty more in flight still wins",
            vec![cold(0, 0, 8), view(0, 4, 8)],
            4,
            Choice::Admit(1),
        ),
        ("cold wins past the penalty", vec![cold(0, 0, 8), view(0, 5, 8)], 4, Choice::Admit(0)),
        ("equal cost: the not-cold one", vec![cold(0, 1, 8), view(0, 5, 8)], 4, Choice::Admit(1)),
        ("equal cost, order does not matter", vec![view(0, 5, 8), cold(0, 1, 8)], 4, Choice::Admit(0)),
        ("two cold: fewest in flight", vec![cold(0, 2, 8), cold(0, 1, 8)], 4, Choice::Admit(1)),
        ("penalty 0: fewest in flight", vec![cold(0, 0, 8), view(0, 1, 8)], 0, Choice::Admit(0)),
        ("a full loaded one: the cold one", vec![view(0, 8, 8), cold(0, 7, 8)], 4, Choice::Admit(1)),
        ("a full group spills, cold or not", vec![view(0, 8, 8), cold(1, 0, 8), view(2, 0, 8)], 4, Choice::Admit(1)),
        ("cold in a better group beats loaded in a worse", vec![view(1, 0, 8), cold(0, 6, 8)], 4, Choice::Admit(1)),
        (
            "an avoided loaded one loses to an untried cold one",
            vec![CandidateView { avoided: true, ..view(0, 0, 8) }, cold(0, 7, 8)],
            4,
            Choice::Admit(1),
        ),
        (
            "an avoided (ejected) one is the last resort, loaded or not",
            vec![CandidateView { avoided: true, ..view(0, 0, 8) }, CandidateView { eligible: false, ..cold(0, 0, 8) }],
            4,
            Choice::Admit(0),
        ),
        ("the penalty is large", vec![cold(0, 0, 20_000), view(0, 9_999, 20_000)], 10_000, Choice::Admit(1)),
    ];
    for (name, candidates, penalty, expected) in rows {
        assert_eq!(choose(&candidates, penalty, no_rotation), expected, "{name}");
    }
}

#[test]
fn penalty_zero_is_the_old_rule_ties_rotate_whatever_the_residency() {
    let c = [cold(0, 1, 4), view(0, 1, 4)];
    let mut cursor = 0;
    let picks: Vec<_> = (0..2)
        .map(|_| {
            choose(&c, 0, |_, _| {
                cursor += 1;
                cursor - 1
            })
        })
        .collect();
    assert_eq!(picks, [Choice::Admit(0), Choice::Admit(1)]);
    assert_eq!(choose(&c, 1, no_rotation), Choice::Admit(1), "with a penalty the loaded one always");
    assert_eq!(choose(&c, 1, |_, _| 1), Choice::Admit(1));
}

const CONFIG: &str = r#"
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: a, node: n1, adapter: ollama, capacity: 2, target: { model: m, base_url: "http://x" }, models: [ { name: chat } ] }
  - { id: b, node: n2, adapter: openai, capacity: 1, target: { model: m, base_url: "http://y" }, models: [ { name: chat, priority: 1 } ] }
"#;

struct Fixture {
    pool: Arc<AdmissionPool>,
    registry: Arc<NodeRegistry>,
    residency: Arc<ResidencyTable>,
    candidates: Arc<[Candidate]>,
    _controls: Vec<mpsc::Receiver<Result<iop_proto::pb::EdgeToNode, tonic::Status>>>,
}

fn fixture() -> Fixture {
    fixture_of(CONFIG)
}

fn fixture_of(yaml: &str) -> Fixture {
    let config = crate::testing::config(yaml);
    let registry = Arc::new(NodeRegistry::default());
    let overlay = Arc::new(HealthOverlay::default());
    let mut controls = Vec::new();
    for (node, provider, generation) in [("n1", "a", 10), ("n2", "b", 20)] {
        let (control, rx) = mpsc::channel(1);
        controls.push(rx);
        registry.register(node, Session::registered(generation, control));
        crate::testing::ready(&registry, &overlay, node, generation, &[provider]);
    }
    let candidates = crate::route::candidates(&config, "chat")
        .unwrap()
        .into_iter()
        .map(|p| Candidate { priority: p.models[0].priority, provider: p.clone() })
        .collect();
    let residency = Arc::new(ResidencyTable::default());
    let pool = AdmissionPool::new(
        &config,
        registry.clone(),
        overlay,
        residency.clone(),
        Default::default(),
        EdgeMetrics::new(),
    );
    Fixture { pool, registry, residency, candidates, _controls: controls }
}

impl Fixture {
    fn request(&self, run_id: &str) -> AdmitRequest {
        AdmitRequest {
            route: "chat".into(),
            run_id: run_id.into(),
            candidates: self.candidates.clone(),
            avoid: HashMap::new(),
        }
    }
}

#[tokio::test]
async fn leases_carry_the_admission_and_release_their_slot_once() {
    let f = fixture();
    let first = f.pool.admit(f.request("r1"), 8, Duration::from_secs(1)).await.unwrap();
    let lease = first.lease().clone();
    assert_eq!((lease.run_id(), lease.provider_id(), lease.node(), lease.generation()), ("r1", "a", "n1", 10));
    assert_eq!(lease.target_model(), "m");
    let second = f.pool.admit(f.request("r2"), 8, Duration::from_secs(1)).await.unwrap();
    assert_eq!(second.lease().provider_id(), "a");
    assert_ne!(second.lease().slot(), lease.slot());
    let third = f.pool.admit(f.request("r3"), 8, Duration::from_secs(1)).await.unwrap();
    assert_eq!(third.lease().provider_id(), "b", "a full group spills to the next");
    drop((first, second, third));
    let snap = f.pool.snapshot();
    assert_eq!((snap.acquired, snap.released, snap.double_releases), (3, 3, 0));
    assert!(snap.providers.values().all(|p| p.in_flight == 0));
}

/// Issue 28 item 6: an ejected provider is skipped while another is
/// eligible, even a lower-priority one; when every candidate is ejected
/// they are still used (panic routing), never `NoneEligible`.
#[tokio::test]
async fn ejected_providers_are_skipped_unless_every_candidate_is_ejected() {
    use crate::core::outlier::Verdict;
    let f = fixture();
    let now = std::time::Instant::now();
    let admit = |run: &'static str| {
        let pool = f.pool.clone();
        let request = f.request(run);
        async move { pool.admit(request, 8, Duration::from_secs(1)).await.unwrap().lease().provider_id().to_string() }
    };
    assert_eq!(admit("r0").await, "a", "the primary");
    for _ in 0..5 {
        f.pool.record_generation("a", "old-run", Verdict::Failure, now);
    }
    assert!(f.pool.outlier_status("a", now).ejected_until.is_some());
    assert_eq!(admit("r1").await, "b", "the ejected primary is skipped for the lower priority");
    assert_eq!(
        gauge_lines(&f.pool, "iop_edge_provider_ejections_total"),
        ["iop_edge_provider_ejections_total{provider=\"a\"} 1"]
    );
    for _ in 0..5 {
        f.pool.record_generation("b", "old-run", Verdict::Failure, now);
    }
    assert_eq!(admit("r2").await, "a", "all ejected: panic routing, by priority as usual");
    f.pool.publish_ejections(now);
    assert_eq!(
        gauge_lines(&f.pool, "iop_edge_provider_ejected"),
        ["iop_edge_provider_ejected{provider=\"a\"} 1", "iop_edge_provider_ejected{provider=\"b\"} 1"]
    );
    f.pool.record_generation("a", "old-run", Verdict::Success, now);
    assert!(f.pool.outlier_status("a", now).ejected_until.is_none(), "a success brings it back");
    f.pool.forgive("b");
    assert!(f.pool.outlier_status("b", now).ejected_until.is_none(), "a recovery the node saw too");
    f.pool.publish_ejections(now);
    assert!(gauge_lines(&f.pool, "iop_edge_provider_ejected").iter().all(|l| l.ends_with(" 0")));
}

/// Issue 29: the pool reads residency from the table, bound to each
/// provider's Ready connection, and the penalty from the config (a
/// reload changes it; a provider it removes is forgotten).
#[tokio::test]
async fn the_pool_prefers_the_loaded_provider_by_the_configured_penalty() {
    use iop_proto::pb;
    let equal = CONFIG.replace("priority: 1", "priority: 0").replace("capacity: 1", "capacity: 8");
    let f = fixture_of(&equal);
    let config = crate::testing::config(&equal);
    let report = |id: &str, residency: pb::ModelResidency| pb::ProviderResidency {
        provider_id: id.into(),
        residency: residency.into(),
        ..Default::default()
    };
    f.residency.apply(&config, &f.registry, "n1", 10, &[report("a", pb::ModelResidency::NotLoaded)]);
    f.residency.apply(&config, &f.registry, "n2", 20, &[report("b", pb::ModelResidency::Loaded)]);
    let mut held = Vec::new();
    for i in 0..6 {
        held.push(f.pool.admit(f.request(&format!("r{i}")), 8, Duration::from_secs(1)).await.unwrap());
    }
    let on = |held: &[LeaseGuard], id: &str| held.iter().filter(|g| g.lease().provider_id() == id).count();
    // b takes runs until it has more than 4 more in flight than a: b
    // 0..=4 wins (cost 0..4 vs a's 4; equal cost goes to the loaded
    // one), then a (cost 4 < b's 5).
    assert_eq!((on(&held, "b"), on(&held, "a")), (5, 1), "{:?}", f.pool.snapshot());
    drop(held);

    let mut off = config.clone();
    off.scheduling.load_penalty = 0;
    f.pool.reconfigure(&off);
    let first = f.pool.admit(f.request("s0"), 8, Duration::from_secs(1)).await.unwrap();
    let second = f.pool.admit(f.request("s1"), 8, Duration::from_secs(1)).await.unwrap();
    let mut both = [first.lease().provider_id(), second.lease().provider_id()];
    both.sort();
    assert_eq!(both, ["a", "b"], "penalty 0: fewest in flight, residency ignored");
    drop((first, second));

    f.registry.remove("n2", 20);
    assert_eq!(f.residency.on("b", 20).residency, crate::core::residency::Residency::Loaded);
    let mut gone = config.clone();
    gone.providers.retain(|p| p.id == "a");
    f.pool.reconfigure(&gone);
    assert_eq!(f.residency.on("b", 20).residency, crate::core::residency::Residency::Unknown, "removed: forgotten");
    assert_eq!(f.residency.on("a", 10).residency, crate::core::residency::Residency::NotLoaded);
}

#[tokio::test]
async fn reconfigure_keeps_slots_in_use_and_retires_removed_ones() {
    let f = fixture();
    let held = f.pool.admit(f.request("r1"), 8, Duration::from_secs(1)).await.unwrap();
    let slot = held.lease().slot();
    let mut config = crate::testing::config(CONFIG);
    config.providers[0].capacity = 1;
    config.providers.retain(|p| p.id == "a");
    f.pool.reconfigure(&config);
    let snap = f.pool.snapshot();
    assert_eq!((snap.providers["a"].in_flight, snap.providers["a"].capacity), (1, 1), "{snap:?}");
    assert!(!snap.providers.contains_key("b"));
    drop(held);
    let snap = f.pool.snapshot();
    assert_eq!(snap.providers["a"].in_flight, 0);
    assert_eq!(snap.double_releases, 0);
    let next = f.pool.admit(f.request("r2"), 8, Duration::from_secs(1)).await.unwrap();
    assert_eq!((slot, next.lease().slot()), (0, 0), "the one remaining slot");
}

/// The series of the metric `name`, as exposed.
fn gauge_lines(pool: &AdmissionPool, name: &str) -> Vec<String> {
    let text = pool.metrics.encode();
    let mut lines: Vec<String> =
        text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).map(str::to_string).collect();
    lines.sort();
    lines
}

/// A reload that removes a provider removes its `in_flight` series at
/// once (a lease it still holds does not bring it back); one that removes
/// a route removes its `queue_depth` series once the requests that still
/// wait in it are gone. A configured route keeps its series at 0.
#[tokio::test]
async fn reconfigure_removes_the_gauges_of_removed_providers_and_routes() {
    let f = fixture();
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(f.pool.admit(f.request(&format!("h{i}")), 8, Duration::from_secs(1)).await.unwrap());
    }
    let gave_up = f.pool.admit(f.request("w0"), 8, Duration::from_millis(10)).await;
    assert_eq!(gave_up.err(), Some(AdmitError::QueueTimeout));
    assert_eq!(gauge_lines(&f.pool, "iop_edge_queue_depth"), [r#"iop_edge_queue_depth{route="chat"} 0"#]);
    let waiter = tokio::spawn({
        let (pool, request) = (f.pool.clone(), f.request("w1"));
        async move { pool.admit(request, 8, Duration::from_secs(30)).await }
    });
    while f.pool.snapshot().queued.get("chat") != Some(&1) {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        gauge_lines(&f.pool, "iop_edge_in_flight"),
        [r#"iop_edge_in_flight{provider="a"} 2"#, r#"iop_edge_in_flight{provider="b"} 1"#]
    );
    assert_eq!(gauge_lines(&f.pool, "iop_edge_queue_depth"), [r#"iop_edge_queue_depth{route="chat"} 1"#]);

    // Provider b goes; a serves `chat2` instead of `chat`.
    let mut config = crate::testing::config(CONFIG);
    config.providers.retain(|p| p.id == "a");
    config.providers[0].models[0].name = "chat2".into();
    f.pool.reconfigure(&config);
    assert_eq!(gauge_lines(&f.pool, "iop_edge_in_flight"), [r#"iop_edge_in_flight{provider="a"} 2"#]);
    assert_eq!(
        gauge_lines(&f.pool, "iop_edge_queue_depth"),
        [r#"iop_edge_queue_depth{route="chat"} 1"#],
        "a request admitted before the reload still waits"
    );
    drop(held);
    let granted = waiter.await.unwrap().unwrap();
    assert_eq!(granted.lease().provider_id(), "a");
    assert_eq!(gauge_lines(&f.pool, "iop_edge_in_flight"), [r#"iop_edge_in_flight{provider="a"} 1"#]);
    assert!(gauge_lines(&f.pool, "iop_edge_queue_depth").is_empty(), "the removed route's queue emptied");
    drop(granted);
    assert_eq!(gauge_lines(&f.pool, "iop_edge_in_flight"), [r#"iop_edge_in_flight{provider="a"} 0"#]);
}

/// Issue 8 item 7: capacity lowered then raised by reloads while runs
/// are in flight never admits more than the capacity.
#[tokio::test]
async fn capacity_lowered_then_raised_with_runs_in_flight_never_over_commits() {
    let f = fixture();
    let mut config = crate::testing::config(CONFIG);
    config.providers.retain(|p| p.id == "a");
    config.providers[0].capacity = 4;
    f.pool.reconfigure(&config);
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(f.pool.admit(f.request(&format!("r{i}")), 8, Duration::from_secs(1)).await.unwrap());
    }
    held.drain(..2); // slots 0 and 1 free up; 2 and 3 stay in flight
    config.providers[0].capacity = 2;
    f.pool.reconfigure(&config);
    assert_eq!(f.pool.snapshot().providers["a"].in_flight, 2);
    config.providers[0].capacity = 4;
    f.pool.reconfigure(&config);
    for i in 4..6 {
        held.push(f.pool.admit(f.request(&format!("r{i}")), 8, Duration::from_secs(1)).await.unwrap());
    }
    let snap = f.pool.snapshot();
    assert_eq!((snap.providers["a"].in_flight, snap.providers["a"].capacity), (4, 4), "{snap:?}");
    let mut slots: Vec<u32> = held.iter().map(|l| l.lease().slot()).collect();
    slots.sort();
    assert_eq!(slots, vec![0, 1, 2, 3], "no slot is held twice");
    let over = f.pool.admit(f.request("r6"), 0, Duration::from_millis(10)).await;
    assert!(over.is_err(), "the fifth run waits (here: the queue is full)");
    drop(held);
    let snap = f.pool.snapshot();
    assert_eq!((snap.providers["a"].in_flight, snap.double_releases), (0, 0), "{snap:?}");
}

#[tokio::test(start_paused = true)]
async fn queue_is_fifo_bounded_and_times_out() {
    let f = fixture();
    let held: Vec<_> = futures_util::future::join_all(
        (0..3).map(|i| f.pool.admit(f.request(&format!("h{i}")), 2, Duration::from_secs(1))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let first = tokio::spawn({
        let (pool, request) = (f.pool.clone(), f.request("q1"));
        async move { pool.admit(request, 2, Duration::from_secs(5)).await }
    });
    let second = tokio::spawn({
        let (pool, request) = (f.pool.clone(), f.request("q2"));
        async move { pool.admit(request, 2, Duration::from_secs(5)).await }
    });
    tokio::task::yield_now().await;
    while f.pool.snapshot().queued.get("chat") != Some(&2) {
        tokio::task::yield_now().await;
    }
    assert_eq!(f.pool.admit(f.request("q3"), 2, Duration::from_secs(5)).await.err(), Some(AdmitError::QueueFull));
    let mut held = held;
    drop(held.remove(0));
    let granted = first.await.unwrap().unwrap();
    assert_eq!(granted.lease().run_id(), "q1", "FIFO: the first waiter gets the first free slot");
    assert_eq!(second.await.unwrap().err(), Some(AdmitError::QueueTimeout));
    assert_eq!(f.pool.snapshot().queued.get("chat"), Some(&0));
}

#[tokio::test]
async fn waiters_fail_fast_when_their_providers_go_away() {
    let f = fixture();
    let held: Vec<_> = futures_util::future::join_all(
        (0..3).map(|i| f.pool.admit(f.request(&format!("h{i}")), 2, Duration::from_secs(1))),
    )
    .await;
    let waiter = tokio::spawn({
        let (pool, request) = (f.pool.clone(), f.request("w"));
        async move { pool.admit(request, 2, Duration::from_secs(30)).await }
    });
    while f.pool.snapshot().queued.get("chat") != Some(&1) {
        tokio::task::yield_now().await;
    }
    f.registry.remove("n1", 10);
    f.registry.remove("n2", 20);
    drop(held);
    assert_eq!(waiter.await.unwrap().err(), Some(AdmitError::NoneEligible));
}

/// Thousands of requests through mixed terminal paths: completion,
/// provider error, retry, node loss, queue timeout, queue full, and the
/// client leaving while queued or while running. Afterwards no slot is
/// leaked and none was released twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_terminal_paths_never_leak_or_double_release() {
    let f = fixture();
    let outcomes = Arc::new(Mutex::new(HashMap::<&'static str, u32>::new()));
    let workers: Vec<_> = (0..48)
        .map(|w| {
            let (pool, candidates, outcomes) = (f.pool.clone(), f.candidates.clone(), outcomes.clone());
            tokio::spawn(async move {
                for i in 0..70u32 {
                    let request = AdmitRequest {
                        route: "chat".into(),
                        run_id: format!("w{w}-{i}"),
                        candidates: candidates.clone(),
                        avoid: HashMap::new(),
                    };
                    let seed = fastrand::u32(..);
                    // Queue wait and client patience vary so that some
                    // requests time out queued and some clients leave.
                    let wait = Duration::from_millis(u64::from(seed % 4));
                    let patience = Duration::from_millis(u64::from((seed >> 8) % 6));
                    let outcome = match tokio::time::timeout(patience, pool.admit(request, 16, wait)).await {
                        Err(_) => "client_left_queue",
                        Ok(Err(AdmitError::QueueFull)) => "queue_full",
                        Ok(Err(AdmitError::QueueTimeout)) => "queue_timeout",
                        Ok(Err(AdmitError::NoneEligible)) => "none_eligible",
                        Ok(Ok(mut guard)) => {
                            let reason = [
                                ReleaseReason::Completed,
                                ReleaseReason::ProviderError,
                                ReleaseReason::Retried,
                                ReleaseReason::NodeDisconnected,
                                ReleaseReason::ClientDisconnected,
                            ][(seed >> 16) as usize % 5];
                            guard.set_reason(reason);
                            if seed.is_multiple_of(3) {
                                tokio::time::sleep(Duration::from_micros(200)).await;
                            } else {
                                tokio::task::yield_now().await;
                            }
                            reason.label()
                        }
                    };
                    *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();
    for path in ["completed", "provider_error", "client_disconnected", "queue_timeout", "queue_full"] {
        assert!(outcomes.get(path).copied().unwrap_or(0) > 0, "path {path} was exercised: {outcomes:?}");
    }
    let snap = f.pool.snapshot();
    assert_eq!(outcomes.values().sum::<u32>(), 48 * 70);
    assert!(snap.acquired > 300, "the test exercised admission: {snap:?} {outcomes:?}");
    assert_eq!(snap.acquired, snap.released, "{snap:?}");
    assert_eq!(snap.double_releases, 0);
    assert_eq!(snap.queued.values().sum::<usize>(), 0);
    assert!(snap.providers.values().all(|p| p.in_flight == 0), "{snap:?}");
}
