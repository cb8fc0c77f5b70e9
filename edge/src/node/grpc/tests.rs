use super::*;

/// A small message is queued and done; a large one is done only once
/// its consumer has taken it (and whatever was queued before it).
#[tokio::test]
async fn a_large_message_waits_until_its_consumer_took_it() {
    let (tx, mut rx) = mpsc::channel::<u32>(4);
    queue(&tx, 1, 100).await.unwrap();
    queue(&tx, 2, LARGE_MESSAGE_BYTES).await.unwrap();
    let large = queue(&tx, 3, LARGE_MESSAGE_BYTES + 1);
    tokio::pin!(large);
    assert!(futures_util::poll!(&mut large).is_pending(), "queued, not yet taken");
    assert_eq!(rx.recv().await, Some(1));
    assert_eq!(rx.recv().await, Some(2));
    assert!(futures_util::poll!(&mut large).is_pending());
    assert_eq!(rx.recv().await, Some(3));
    large.await.unwrap();
    drop(rx);
    assert!(queue(&tx, 4, LARGE_MESSAGE_BYTES + 1).await.is_err(), "the consumer is gone");
}
