use super::*;

/// Issue 8 item 5: a waiter that goes away (its admin client
/// disconnected) leaves no pending entry behind.
#[tokio::test]
async fn a_waiter_that_goes_away_leaves_no_entry() {
    let table = CommandTable::default();
    let (control, mut node) = tokio::sync::mpsc::channel(1);
    let mut waiter = Box::pin(table.send(&control, pb::NodeCommand::default(), Duration::from_secs(3600)));
    tokio::select! {
        biased;
        _ = &mut waiter => panic!("nobody answered"),
        sent = node.recv() => assert!(sent.is_some(), "the command went out"),
    }
    assert_eq!(table.pending(), 1);
    drop(waiter);
    assert_eq!(table.pending(), 0);
}

#[tokio::test]
async fn an_answer_reaches_its_waiter_and_clears_the_entry() {
    let table = std::sync::Arc::new(CommandTable::default());
    let (control, mut node) = tokio::sync::mpsc::channel(1);
    let answering = table.clone();
    let answer = tokio::spawn(async move {
        let Some(Ok(pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::Command(c)) })) = node.recv().await else {
            panic!("expected a command")
        };
        assert!(answering.complete(pb::NodeCommandResult { command_id: c.command_id, ..Default::default() }));
    });
    assert!(table.send(&control, pb::NodeCommand::default(), Duration::from_secs(3600)).await.is_ok());
    answer.await.unwrap();
    assert_eq!(table.pending(), 0);
}
