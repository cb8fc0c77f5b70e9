use std::net::{IpAddr, Ipv4Addr};

use super::*;

fn source(last: u8) -> Source {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn held(id: u64, source: Source, idle_ms: Option<u64>, now: Instant) -> Held {
    Held { id, source, idle_since: idle_ms.map(|ms| now - Duration::from_millis(ms)) }
}

const LIMITS: ConnectionLimits = ConnectionLimits { max_connections: 3, max_per_source: 2 };

/// The decision table: a free slot is taken; a full listener gives the slot
/// of the connection idle the longest (never a busy one); a full source
/// gets none, even with slots free; all busy: wait.
#[test]
fn a_new_connection_takes_a_free_slot_then_the_longest_idle_one() {
    let now = Instant::now();
    assert_eq!(admit(&[], source(2), LIMITS), Verdict::Accept);
    let two = [held(1, source(2), Some(5), now), held(2, source(3), None, now)];
    assert_eq!(admit(&two, source(4), LIMITS), Verdict::Accept);
    let full = [held(1, source(2), Some(5), now), held(2, source(3), None, now), held(3, source(4), Some(900), now)];
    assert_eq!(admit(&full, source(5), LIMITS), Verdict::Shed(3), "idle the longest");
    let busy = [held(1, source(2), None, now), held(2, source(3), None, now), held(3, source(4), None, now)];
    assert_eq!(admit(&busy, source(5), LIMITS), Verdict::Full);
    let one_source = [held(1, source(2), None, now), held(2, source(2), Some(1), now)];
    assert_eq!(admit(&one_source, source(2), LIMITS), Verdict::SourceFull);
    assert_eq!(admit(&one_source, source(3), LIMITS), Verdict::Accept);
}

/// The table carries the decision out: a busy connection is never shed,
/// the idle one is told to go and gives its slot up at once, and a
/// connection waiting for room gets it when a busy one becomes idle.
#[tokio::test(start_paused = true)]
async fn the_table_sheds_the_idle_and_makes_room_as_requests_end() {
    let refused = Family::<ReasonLabels, Counter>::default();
    let table = ConnectionTable::new(ConnectionLimits { max_connections: 2, max_per_source: 10 }, refused.clone());
    let busy_one = table.enter(source(2)).await.unwrap();
    let working = busy_one.busy();
    tokio::time::advance(Duration::from_millis(10)).await;
    let idle_one = table.enter(source(3)).await.unwrap();
    let third = table.enter(source(4)).await.unwrap();
    assert!(idle_one.shed.is_cancelled() && !busy_one.shed.is_cancelled());
    assert!(!third.shed.is_cancelled());
    assert_eq!(refused.get_or_create(&ReasonLabels { reason: "shed_idle" }).get(), 1, "counted where decided");
    // Both slots busy now: the next waits until a request ends.
    let _third_working = third.busy();
    let waiting = tokio::spawn({
        let table = table.clone();
        async move { table.enter(source(5)).await.map(|slot| slot.shed.clone()) }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    drop(working);
    let _fifth = waiting.await.unwrap().expect("room once a request ended");
    assert!(busy_one.shed.is_cancelled(), "the connection that became idle gave its slot");
}

/// A connection is idle from its start and after its last answer, and not
/// while one is being answered.
#[tokio::test(start_paused = true)]
async fn idle_for_counts_from_the_last_answer() {
    let table = ConnectionTable::new(LIMITS, Default::default());
    let slot = table.enter(source(2)).await.unwrap();
    let working = slot.busy();
    let idle = tokio::time::timeout(Duration::from_secs(60), slot.idle_for(Duration::from_secs(1)));
    assert!(idle.await.is_err(), "busy all along: never idle");
    drop(working);
    let started = Instant::now();
    slot.idle_for(Duration::from_secs(1)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}
