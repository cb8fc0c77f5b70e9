use super::*;

fn text(seq: u64, t: &str) -> pb::RunEvent {
    pb::RunEvent { seq, event: Some(pb::run_event::Event::Text(pb::TextDelta { text: t.into() })) }
}

type Table = RunTable<pb::RunEvent>;

async fn started(
    table: &Arc<Table>,
) -> (RunStream<pb::RunEvent>, mpsc::Receiver<Result<pb::EdgeToNode, tonic::Status>>) {
    started_with(table, pb::RunRequest { run_id: "r1".into(), ..Default::default() }).await
}

async fn started_with(
    table: &Arc<Table>,
    request: pb::RunRequest,
) -> (RunStream<pb::RunEvent>, mpsc::Receiver<Result<pb::EdgeToNode, tonic::Status>>) {
    let (control, control_rx) = mpsc::channel(8);
    let lease = crate::testing::lease("r1", "n1", 5);
    let handoff = Arc::new(StallHandoff {
        registry: Arc::new(crate::node::registry::NodeRegistry::default()),
        overlay: Default::default(),
        metrics: EdgeMetrics::new(),
    });
    let stream = start_run(table, &EdgeMetrics::new(), &handoff, lease, control, request, None).await.unwrap();
    (stream, control_rx)
}

#[tokio::test]
async fn attach_checks_node_generation_and_uniqueness() {
    let table = Arc::new(Table::default());
    let (_stream, _control) = started(&table).await;
    assert_eq!(table.attach("r2", "n1", 5).err(), Some(AttachError::UnknownRun));
    assert_eq!(table.attach("r1", "n2", 5).err(), Some(AttachError::WrongNode));
    assert_eq!(table.attach("r1", "n1", 4).err(), Some(AttachError::FencedGeneration));
    let attached = table.attach("r1", "n1", 5).expect("the run's own node and generation");
    assert!(attached.request.is_none(), "a small request rode the assignment");
    assert_eq!(table.attach("r1", "n1", 5).err(), Some(AttachError::AlreadyAttached));
}

/// Issue 9: a small request rides the assignment; a larger one is kept
/// for the run's own call and never touches the control stream.
#[tokio::test]
async fn only_a_small_request_rides_the_control_stream() {
    let assigned = |control: &mut mpsc::Receiver<Result<pb::EdgeToNode, tonic::Status>>| match control.try_recv() {
        Ok(Ok(pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::RunAssign(a)) })) => a,
        other => panic!("expected the assignment, got {other:?}"),
    };
    let request = |content: String| pb::RunRequest {
        run_id: "r1".into(),
        messages: vec![pb::ChatMessage { role: pb::Role::User.into(), content, ..Default::default() }],
        ..Default::default()
    };
    let limit = iop_proto::wire::MAX_INLINE_REQUEST_BYTES;

    let table = Arc::new(Table::default());
    let small = request("x".repeat(limit - 64));
    assert!(inline(&small));
    let (_stream, mut control) = started_with(&table, small.clone()).await;
    assert_eq!(assigned(&mut control).request, Some(small));
    assert_eq!(table.attach("r1", "n1", 5).unwrap().request, None);

    let table = Arc::new(Table::default());
    let large = request("x".repeat(limit));
    assert!(!inline(&large));
    let (_stream, mut control) = started_with(&table, large.clone()).await;
    assert_eq!(assigned(&mut control), pb::RunAssign { run_id: "r1".into(), request: None });
    assert_eq!(table.attach("r1", "n1", 5).unwrap().request, Some(large), "kept for the run's own call");
}

#[tokio::test]
async fn fencing_ends_the_run_with_transport_lost_and_refuses_late_attach() {
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    let attached = table.attach("r1", "n1", 5).unwrap();
    attached.events.send(text(1, "a")).await.unwrap();
    assert_eq!(table.fence_generation("n1", 5), 1);
    assert!(matches!(stream.next().await, Some(pb::run_event::Event::Text(_))));
    match stream.next().await {
        Some(pb::run_event::Event::Failed(f)) => assert_eq!(f.failure.unwrap().kind(), FailureKind::TransportLost),
        other => panic!("expected transport failure, got {other:?}"),
    }
    assert!(stream.next().await.is_none(), "exactly one terminal");
    assert!(attached.fence.is_cancelled());
    assert_eq!(table.attach("r1", "n1", 5).err(), Some(AttachError::UnknownRun));
}

/// Issue 8 item 4: the node's event stream ends without a terminal. The
/// run fails at once (not at the request deadline) and frees its slot.
#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_without_a_terminal_fails_the_run_at_once() {
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    let attached = table.attach("r1", "n1", 5).unwrap();
    attached.events.send(text(1, "a")).await.unwrap();
    drop(attached);
    let limit = std::time::Duration::from_secs(60);
    let first = tokio::time::timeout(limit, stream.next()).await.expect("no hang");
    assert!(matches!(first, Some(pb::run_event::Event::Text(_))));
    match tokio::time::timeout(limit, stream.next()).await.expect("no hang until the deadline") {
        Some(pb::run_event::Event::Failed(f)) => assert_eq!(f.failure.unwrap().kind(), FailureKind::TransportLost),
        other => panic!("expected a typed failure, got {other:?}"),
    }
    assert_eq!(table.in_flight(), 0, "the run left the table");
    assert_eq!(stream.lease.reason(), ReleaseReason::NodeDisconnected);
    drop(stream);
}

#[tokio::test]
async fn out_of_order_events_fail_the_run() {
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    let attached = table.attach("r1", "n1", 5).unwrap();
    attached.events.send(text(2, "skipped one")).await.unwrap();
    match stream.next().await {
        Some(pb::run_event::Event::Failed(f)) => {
            assert_eq!(f.failure.unwrap().kind(), FailureKind::ProviderProtocol)
        }
        other => panic!("expected protocol failure, got {other:?}"),
    }
}

#[tokio::test]
async fn events_with_unknown_enum_values_fail_the_run() {
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    let attached = table.attach("r1", "n1", 5).unwrap();
    let bogus =
        pb::RunEvent { seq: 1, event: Some(pb::run_event::Event::Completed(pb::RunCompleted { finish_reason: 77 })) };
    attached.events.send(bogus).await.unwrap();
    match stream.next().await {
        Some(pb::run_event::Event::Failed(f)) => {
            let f = f.failure.unwrap();
            assert_eq!(f.kind(), FailureKind::ProviderProtocol);
            assert!(f.message.contains("finish_reason"), "{}", f.message);
        }
        other => panic!("expected protocol failure, got {other:?}"),
    }
    assert!(stream.next().await.is_none());
}

/// Issue 28 item 6: the run's terminal is where outlier ejection learns
/// how a generation ended: a provider 5xx counts; a 429, a client error
/// and the node's connection ending do not (each run here has a fresh
/// pool).
#[tokio::test]
async fn run_terminals_feed_outlier_ejection() {
    let failed = |seq, status| {
        let mut failure = pb::ExecutionFailure::new(FailureKind::ProviderHttpStatus, "x");
        failure.provider_status = status;
        pb::RunEvent { seq, event: Some(pb::run_event::Event::Failed(pb::RunFailed { failure: Some(failure) })) }
    };
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    let attached = table.attach("r1", "n1", 5).unwrap();
    attached.events.send(failed(1, 503)).await.unwrap();
    assert!(matches!(stream.next().await, Some(pb::run_event::Event::Failed(_))));
    assert_eq!(stream.lease.outlier_status().consecutive_failures, 1);

    for (status, counted) in [(429, 0), (400, 0)] {
        let (mut stream, _control) = started(&table).await;
        let attached = table.attach("r1", "n1", 5).unwrap();
        attached.events.send(failed(1, status)).await.unwrap();
        stream.next().await;
        assert_eq!(stream.lease.outlier_status().consecutive_failures, counted, "{status}");
    }

    let (mut stream, _control) = started(&table).await;
    table.fence_generation("n1", 5);
    stream.next().await;
    assert_eq!(stream.lease.outlier_status().consecutive_failures, 0, "the node's connection, not the provider");
}

/// A tunnel's relayed 5xx response is a complete exchange for the node
/// but a failed generation for ejection.
#[tokio::test]
async fn a_tunnelled_5xx_response_counts_as_a_failure() {
    use pb::provider_tunnel_frame::Frame;
    let table = Arc::new(RunTable::<pb::ProviderTunnelFrame>::default());
    let (control, _control_rx) = mpsc::channel(8);
    let handoff = Arc::new(StallHandoff {
        registry: Arc::new(crate::node::registry::NodeRegistry::default()),
        overlay: Default::default(),
        metrics: EdgeMetrics::new(),
    });
    let lease = crate::testing::lease("r1", "n1", 5);
    let request = pb::ProviderTunnelRequest { tunnel_id: "r1".into(), ..Default::default() };
    let mut stream = start_run(&table, &EdgeMetrics::new(), &handoff, lease, control, request, None).await.unwrap();
    let attached = table.attach("r1", "n1", 5).unwrap();
    let frame = |seq, frame| pb::ProviderTunnelFrame { seq, frame: Some(frame) };
    attached.events.send(frame(1, Frame::Head(pb::TunnelResponseHead { status: 502, headers: vec![] }))).await.unwrap();
    attached.events.send(frame(2, Frame::End(pb::TunnelEnd::default()))).await.unwrap();
    assert!(matches!(stream.next().await, Some(Frame::Head(_))));
    assert!(matches!(stream.next().await, Some(Frame::End(_))));
    assert_eq!(stream.lease.outlier_status().consecutive_failures, 1);
}

#[tokio::test]
async fn runs_cut_by_shutdown_release_as_edge_shutdown() {
    let table = Arc::new(Table::default());
    let (mut stream, _control) = started(&table).await;
    table.begin_shutdown();
    table.fence_generation("n1", 5);
    assert!(matches!(stream.next().await, Some(pb::run_event::Event::Failed(_))));
    assert_eq!(stream.lease.reason(), ReleaseReason::EdgeShutdown);
}

#[tokio::test]
async fn dropping_before_the_terminal_sends_cancel_and_frees_the_entry() {
    let table = Arc::new(Table::default());
    let (stream, mut control) = started(&table).await;
    match control.recv().await {
        Some(Ok(pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::RunAssign(a)) })) => {
            assert_eq!(a.run_id, "r1")
        }
        other => panic!("expected the assignment, got {other:?}"),
    }
    drop(stream);
    match control.recv().await {
        Some(Ok(pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::Cancel(c)) })) => assert_eq!(c.run_id, "r1"),
        other => panic!("expected cancel, got {other:?}"),
    }
    assert_eq!(table.in_flight(), 0);
}

/// A tunnel's error answer is judged as the gate reads it: llama.cpp's
/// refusal of an image is the request's fault, its out-of-memory 500 the
/// provider's; split across body frames, read whole.
#[test]
fn a_tunnel_error_answer_is_judged_as_the_gate_reads_it() {
    let head = pb::TunnelResponseHead { status: 500, ..Default::default() };
    let no_images: &[u8] = br#"{"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected, you may need to provide the mmproj","type":"server_error"}}"#;
    let (first, rest) = no_images.split_at(40);
    let refused = http_failure(&head, &[first, rest]);
    assert_eq!(refused.provider_code, iop_proto::provider_error::UNSUPPORTED_CONTENT);
    assert_eq!(outlier::verdict(Some(&refused), None), Verdict::Neutral);
    let out_of_memory = http_failure(&head, &[br#"{"error":{"code":500,"message":"out of memory"}}"#.as_slice()]);
    assert_eq!(outlier::verdict(Some(&out_of_memory), None), Verdict::Failure);
    let unavailable = pb::TunnelResponseHead { status: 502, ..Default::default() };
    assert_eq!(outlier::verdict(Some(&http_failure(&unavailable, &[b"".as_slice()])), None), Verdict::Failure);
}
