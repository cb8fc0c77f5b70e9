use super::calls::Attached;
use super::*;
use crate::dispatch::AttachError;

fn pending(calls: &WorkspaceCalls, id: &str) -> (CancellationToken, oneshot::Receiver<Attached>) {
    let (attach, attached) = oneshot::channel();
    let fence = CancellationToken::new();
    let entry = Pending { node: "n1".into(), generation: 5, fence: fence.clone(), attach: Some(attach) };
    calls.calls.lock().unwrap().insert(id.into(), entry);
    (fence, attached)
}

/// A node's call binds only to its own request, node and generation,
/// once; fencing the generation fences the call.
#[tokio::test]
async fn a_call_attaches_once_to_its_own_node_and_generation() {
    let calls = WorkspaceCalls::default();
    let (fence, mut attached) = pending(&calls, "r1");
    assert_eq!(calls.attach("r2", "n1", 5).err(), Some(AttachError::UnknownRun));
    assert_eq!(calls.attach("r1", "n2", 5).err(), Some(AttachError::WrongNode));
    assert_eq!(calls.attach("r1", "n1", 4).err(), Some(AttachError::FencedGeneration));
    assert!(attached.try_recv().is_err(), "refused attaches hand nothing over");
    let call = calls.attach("r1", "n1", 5).expect("its own node and generation");
    assert!(attached.try_recv().is_ok(), "the waiting WorkspaceCall gets the call");
    assert_eq!(calls.attach("r1", "n1", 5).err(), Some(AttachError::AlreadyAttached));

    assert_eq!(calls.fence_generation("n1", 4), 0);
    assert_eq!(calls.fence_generation("n1", 5), 1);
    assert!(fence.is_cancelled() && call.fence.is_cancelled());
    assert_eq!(calls.in_flight(), 0);

    let (fence, _attached) = pending(&calls, "r3");
    fence.cancel();
    assert_eq!(calls.attach("r3", "n1", 5).err(), Some(AttachError::FencedGeneration));
}

/// Answers that do not match the pending call (stale or repeated
/// identities) are dropped and counted; a fenced call fails closed.
#[tokio::test]
async fn only_the_pending_calls_answer_is_taken() {
    let (downlink, mut sent) = mpsc::channel(4);
    let (uplink, answers) = mpsc::channel(8);
    let fence = CancellationToken::new();
    let metrics = EdgeMetrics::new();
    let mut call = WorkspaceCall {
        request_id: "r1".into(),
        generation: 5,
        calls: Arc::default(),
        metrics: metrics.clone(),
        fence: fence.clone(),
        downlink,
        uplink: answers,
    };
    let answer = |request: &str, stage: &str, tool: &str| pb::WorkspaceUplink {
        msg: Some(Up::Tool(pb::WorkspaceToolResponse {
            request_id: request.into(),
            stage_id: stage.into(),
            tool_call_id: tool.into(),
            result: Some(pb::workspace_tool_response::Result::Write(pb::WorkspaceDone {})),
        })),
    };
    for stale in [answer("r1", "working-1", "t0"), answer("r1", "planning-1", "t1"), answer("r2", "working-1", "t1")] {
        uplink.send(stale).await.unwrap();
    }
    uplink.send(answer("r1", "working-1", "t1")).await.unwrap();
    let op = pb::workspace_tool_request::Op::Delete(pb::WorkspaceDelete { path: "a".into() });
    let got = call.tool("working-1", "t1", op.clone(), &CancellationToken::new()).await.unwrap();
    assert_eq!((got.stage_id.as_str(), got.tool_call_id.as_str()), ("working-1", "t1"));
    assert!(matches!(
        sent.recv().await,
        Some(Ok(pb::WorkspaceDownlink { msg: Some(pb::workspace_downlink::Msg::Tool(_)) }))
    ));
    assert!(metrics.encode().contains("iop_edge_workspace_frames_dropped_total{reason=\"unexpected_answer\"} 3"));

    fence.cancel();
    assert_eq!(call.tool("working-1", "t2", op, &CancellationToken::new()).await.err(), Some(WorkspaceError::Fenced));
}
