//! Leader election: the pure decision, and rounds against the mocked API
//! with tokio's paused clock (expiry is measured on our own clock).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::runtime::tests::{FixedClock, NOW, mock};

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/iop/leases";
const NOW_TEXT: &str = "2026-11-01T12:00:00.000000Z";

fn lease(holder: Option<&str>, rv: &str, transitions: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(LEASE_NAME.to_string()),
            namespace: Some("iop".to_string()),
            resource_version: Some(rv.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(1_000).unwrap())),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    }
}

fn elector(client: kube::Client, config: LeaderConfig) -> Elector {
    Elector::new(Api::namespaced(client, "iop"), config, Arc::new(FixedClock(NOW)))
}

fn with_rv(mut body: Value, rv: &str) -> Value {
    body["metadata"]["resourceVersion"] = json!(rv);
    body
}

#[test]
fn decisions() {
    let d = Duration::from_secs(15);
    let s = Duration::from_secs;
    assert_eq!(decide(None, "a", s(0), d), Decision::Create);
    assert_eq!(decide(Some(&lease(Some("a"), "1", 0)), "a", s(100), d), Decision::Renew);
    assert_eq!(decide(Some(&lease(None, "1", 0)), "a", s(0), d), Decision::Acquire, "released");
    assert_eq!(decide(Some(&lease(Some(""), "1", 0)), "a", s(0), d), Decision::Acquire, "released");
    assert_eq!(decide(Some(&lease(Some("b"), "1", 0)), "a", s(14), d), Decision::Follow);
    assert_eq!(decide(Some(&lease(Some("b"), "1", 0)), "a", s(15), d), Decision::Acquire, "expired");
    // The holder's duration counts, not ours.
    let mut long = lease(Some("b"), "1", 0);
    long.spec.as_mut().unwrap().lease_duration_seconds = Some(60);
    assert_eq!(decide(Some(&long), "a", s(30), d), Decision::Follow);
}

#[tokio::test]
async fn no_lease_is_created_and_a_held_one_is_renewed() {
    let (client, mut server) = mock();
    let mut e = elector(client, LeaderConfig::new("pod-a"));
    let task = tokio::spawn(async move {
        let first = e.round().await.unwrap();
        let second = e.round().await.unwrap();
        (first, second)
    });

    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.not_found();
    let call = server.expect("POST", PATH, &[]).await;
    assert_eq!(
        call.body["spec"],
        json!({"holderIdentity": "pod-a", "leaseDurationSeconds": 15, "leaseTransitions": 0,
               "acquireTime": NOW_TEXT, "renewTime": NOW_TEXT})
    );
    let created = with_rv(call.body.clone(), "1");
    call.respond(201, created.clone());

    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.respond(200, created);
    let call = server.expect("PUT", &format!("{PATH}/{LEASE_NAME}"), &[]).await;
    assert_eq!(call.body["metadata"]["resourceVersion"], "1", "guarded by what was read");
    assert_eq!(call.body["spec"]["holderIdentity"], "pod-a");
    assert_eq!(call.body["spec"]["leaseTransitions"], 0);
    let renewed = with_rv(call.body.clone(), "2");
    call.respond(200, renewed);

    assert_eq!(task.await.unwrap(), (true, true));
    server.done().await;
}

#[tokio::test]
async fn losing_a_race_is_not_leading() {
    let (client, mut server) = mock();
    let mut e = elector(client, LeaderConfig::new("pod-a"));
    let task = tokio::spawn(async move { e.round().await.unwrap() });
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.not_found();
    server.expect("POST", PATH, &[]).await.conflict();
    assert!(!task.await.unwrap());
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_is_followed_and_an_expired_one_taken_over() {
    let (client, mut server) = mock();
    let mut e = elector(client, LeaderConfig::new("pod-a"));
    let fetch = |e: Elector| async move {
        let mut e = e;
        let led = e.round().await.unwrap();
        (led, e)
    };

    // pod-b holds it; we start observing.
    let task = tokio::spawn(fetch(e));
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.ok(&lease(Some("pod-b"), "5", 3));
    (_, e) = task.await.unwrap();

    // pod-b renews (new resourceVersion) after 10 s: the clock restarts.
    tokio::time::advance(Duration::from_secs(10)).await;
    let task = tokio::spawn(fetch(e));
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.ok(&lease(Some("pod-b"), "6", 3));
    let (led, back) = task.await.unwrap();
    assert!(!led);
    e = back;

    // 14 s without change: still pod-b's.
    tokio::time::advance(Duration::from_secs(14)).await;
    let task = tokio::spawn(fetch(e));
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.ok(&lease(Some("pod-b"), "6", 3));
    let (led, back) = task.await.unwrap();
    assert!(!led);
    e = back;

    // 15 s: expired; taken over with one more transition.
    tokio::time::advance(Duration::from_secs(1)).await;
    let task = tokio::spawn(fetch(e));
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.ok(&lease(Some("pod-b"), "6", 3));
    let call = server.expect("PUT", &format!("{PATH}/{LEASE_NAME}"), &[]).await;
    assert_eq!(call.body["metadata"]["resourceVersion"], "6");
    assert_eq!(
        call.body["spec"],
        json!({"holderIdentity": "pod-a", "leaseDurationSeconds": 15, "leaseTransitions": 4,
               "acquireTime": NOW_TEXT, "renewTime": NOW_TEXT})
    );
    let answer = with_rv(call.body.clone(), "7");
    call.respond(200, answer);
    let (led, mut e) = task.await.unwrap();
    assert!(led);

    // Shutdown: released (no holder, 1 s) so a standby takes over at once.
    let task = tokio::spawn(async move { e.release().await.unwrap() });
    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.ok(&lease(Some("pod-a"), "8", 4));
    let call = server.expect("PUT", &format!("{PATH}/{LEASE_NAME}"), &[]).await;
    assert_eq!(call.body["spec"]["holderIdentity"], Value::Null);
    assert_eq!(call.body["spec"]["leaseDurationSeconds"], 1);
    let answer = call.body.clone();
    call.respond(200, answer);
    task.await.unwrap();
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_steps_down_before_the_lease_expires() {
    let (client, mut server) = mock();
    let config = LeaderConfig {
        retry_period: Duration::from_millis(500),
        renew_deadline: Duration::from_secs(2),
        round_timeout: Duration::from_millis(400),
        ..LeaderConfig::new("pod-a")
    };
    let (tx, mut leading) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(elector(client, config), tx, shutdown.clone()));

    server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await.not_found();
    let call = server.expect("POST", PATH, &[]).await;
    let created = with_rv(call.body.clone(), "1");
    call.respond(201, created);
    leading.wait_for(|l| *l).await.unwrap();
    let since = tokio::time::Instant::now();

    // Every later round fails: still leading until the renew deadline...
    for _ in 0..4 {
        let call = server.expect("GET", &format!("{PATH}/{LEASE_NAME}"), &[]).await;
        assert!(*leading.borrow(), "at {:?}", since.elapsed());
        call.fail(500, "InternalError");
    }
    // ...then stepped down (2 s < the 15 s another candidate waits), and
    // from then on backs off (0.5 s doubled for each of the 4 failures).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!*leading.borrow());
    assert_eq!(since.elapsed(), Duration::from_millis(2500));
    let call = server.next_within(Duration::from_secs(10)).await;
    assert_eq!((call.method.as_str(), since.elapsed()), ("GET", Duration::from_millis(6000)));
    call.fail(500, "InternalError");

    shutdown.cancel();
    let _elector = task.await.unwrap();
    assert!(!*leading.borrow());
}

#[test]
fn reachability_is_said_once_per_change() {
    let mut r = Reachability::default();
    assert_eq!(r.observe(true), None);
    assert_eq!(r.observe(false), Some(Reach::Lost));
    for _ in 0..10 {
        assert_eq!(r.observe(false), None, "not again while it stays unreachable");
    }
    assert_eq!(r.observe(true), Some(Reach::Back));
    assert_eq!(r.observe(true), None);
    assert_eq!(r.observe(false), Some(Reach::Lost));
}

#[test]
fn a_standby_backs_off_while_the_api_server_is_away_and_a_leader_does_not() {
    let (retry, max) = (Duration::from_secs(2), Duration::from_secs(15));
    let mut r = Reachability::default();
    assert_eq!(r.wait(false, retry, max), retry);
    let mut waits = Vec::new();
    for _ in 0..6 {
        r.observe(false);
        waits.push(r.wait(false, retry, max).as_secs());
        assert_eq!(r.wait(true, retry, max), retry, "a leader keeps renewing on time");
    }
    assert_eq!(waits, [2, 4, 8, 15, 15, 15]);
    r.observe(true);
    assert_eq!(r.wait(false, retry, max), retry);
}

/// The rounds of a candidate that does not lead, against an API server that
/// fails: spaced 0.5, 1, 2, 4, 4 s (backoff up to the lease duration), not
/// every retry period.
#[tokio::test(start_paused = true)]
async fn a_candidate_backs_off_against_a_failing_api_server() {
    let (client, mut server) = mock();
    let config = LeaderConfig {
        retry_period: Duration::from_millis(500),
        lease_duration: Duration::from_secs(4),
        round_timeout: Duration::from_millis(400),
        ..LeaderConfig::new("pod-a")
    };
    let (tx, leading) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(elector(client, config), tx, shutdown.clone()));
    let mut at = Vec::new();
    let start = tokio::time::Instant::now();
    for _ in 0..6 {
        let call = server.next_within(Duration::from_secs(10)).await;
        assert_eq!((call.method.as_str(), call.path.as_str()), ("GET", format!("{PATH}/{LEASE_NAME}").as_str()));
        at.push(start.elapsed().as_millis());
        call.fail(503, "ServiceUnavailable");
    }
    assert_eq!(at, [0, 500, 1500, 3500, 7500, 11500]);
    assert!(!*leading.borrow());
    shutdown.cancel();
    let _elector = task.await.unwrap();
}
