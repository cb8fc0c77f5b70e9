use super::*;

const GRACE: Duration = Duration::from_secs(30);

fn inputs(ready_nodes: usize, nodes: usize, since_start: u64) -> Inputs {
    Inputs {
        draining: false,
        was_ready: false,
        nodes,
        ready_nodes,
        since_start: Duration::from_secs(since_start),
        startup_grace: GRACE,
    }
}

/// A starting replica waits for every node of the config, for at most the
/// startup grace.
#[test]
fn a_starting_replica_waits_for_every_node() {
    let starting = |left| Readiness::Starting { grace_left: Duration::from_secs(left) };
    let cases = [
        // (ready nodes, nodes, seconds since start) -> readiness
        ((0, 2, 0), starting(30)),
        ((1, 2, 5), starting(25)),
        ((2, 2, 5), Readiness::Ready(Ready::EveryNode)),
        // A session of a node the config no longer lists is not waited for.
        ((3, 2, 5), Readiness::Ready(Ready::EveryNode)),
        ((0, 0, 0), Readiness::Ready(Ready::NoNodes)),
        ((1, 2, 30), Readiness::Ready(Ready::StartupGrace)),
        ((0, 1, 31), Readiness::Ready(Ready::StartupGrace)),
    ];
    for ((ready, nodes, since), want) in cases {
        assert_eq!(Readiness::of(inputs(ready, nodes, since)), want, "{ready} of {nodes} after {since} s");
    }
}

/// Once ready, a node lost does not take the replica out of rotation (it is
/// lost for every replica); draining always does.
#[test]
fn ready_stays_until_draining() {
    let was_ready = Inputs { was_ready: true, ..inputs(1, 2, 5) };
    assert_eq!(Readiness::of(was_ready), Readiness::Ready(Ready::WasReady));
    assert_eq!(Readiness::of(Inputs { ready_nodes: 0, ..was_ready }), Readiness::Ready(Ready::WasReady));
    assert_eq!(Readiness::of(Inputs { ready_nodes: 2, ..was_ready }), Readiness::Ready(Ready::EveryNode));
    for ready in [0, 2] {
        let draining = Inputs { draining: true, ..inputs(ready, 2, 60) };
        assert_eq!(Readiness::of(draining), Readiness::Draining);
        assert_eq!(Readiness::of(Inputs { was_ready: true, ..draining }), Readiness::Draining);
    }
    assert_eq!(Readiness::of(Inputs { draining: true, ..inputs(0, 0, 0) }), Readiness::Draining);
}

/// `/readyz`'s status and reason say what the replica waits for.
#[test]
fn status_and_reason() {
    let starting = Readiness::of(inputs(1, 2, 18));
    assert!(!starting.is_ready());
    assert_eq!(starting.status(), "starting");
    assert_eq!(starting.reason(1, 2), "waiting for nodes: 1 of 2 ready (ready anyway in 12000 ms, --startup-grace-ms)");
    let ready = Readiness::of(inputs(2, 2, 1));
    assert!(ready.is_ready());
    assert_eq!((ready.status(), ready.reason(2, 2).as_str()), ("ready", "every node holds a ready session: 2 of 2"));
    let grace = Readiness::of(inputs(1, 2, 30));
    assert_eq!(grace.reason(1, 2), "the startup grace passed with 1 of 2 nodes ready");
    let draining = Readiness::of(Inputs { draining: true, ..inputs(2, 2, 1) });
    assert_eq!((draining.status(), draining.is_ready()), ("draining", false));
}
