//! The node's side of the workspace wire against a fake Edge: a real gRPC
//! server whose `WorkspaceCalls` hands each call to the test, real files and
//! real processes. The protocol's refusals (stale generation, unknown ref,
//! repeated request, busy, duplicate call, denied, not open), cancel, and
//! cleanup however a request ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use iop_proto::pb::workspace_downlink::Msg as Down;
use iop_proto::pb::workspace_tool_request::Op as ToolOp;
use iop_proto::pb::workspace_uplink::Msg as Up;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::transport::fake_edge::{self, Downlink};
use crate::workspace::sandbox::SandboxMode;

const GENERATION: u64 = 7;
const WAIT: Duration = Duration::from_secs(10);

/// One workspace call as the fake Edge received it.
struct Call {
    attach: pb::WorkspaceAttach,
    down: mpsc::Sender<Result<pb::WorkspaceDownlink, Status>>,
    up: Streaming<pb::WorkspaceUplink>,
}

impl Call {
    async fn send(&self, msg: Down) {
        self.down.send(Ok(pb::WorkspaceDownlink { msg: Some(msg) })).await.unwrap();
    }

    async fn next(&mut self) -> Up {
        let message = tokio::time::timeout(WAIT, self.up.message()).await.expect("an answer in time");
        message.unwrap().expect("the call is open").msg.expect("a message")
    }

    async fn open(
        &mut self,
        reference: &str,
        generation: u64,
        authority: pb::WorkspaceAuthority,
    ) -> pb::WorkspaceOpenResponse {
        let request_id = self.attach.request_id.clone();
        self.send(Down::Open(pb::WorkspaceOpenRequest {
            request_id,
            generation,
            r#ref: reference.into(),
            authority: Some(authority),
        }))
        .await;
        match self.next().await {
            Up::Open(open) => open,
            other => panic!("expected the open's answer, got {other:?}"),
        }
    }

    async fn tool(&mut self, id: &str, op: ToolOp) -> pb::WorkspaceToolResponse {
        self.start_tool(id, op).await;
        self.tool_answer().await
    }

    async fn start_tool(&self, id: &str, op: ToolOp) {
        let request_id = self.attach.request_id.clone();
        let call =
            pb::WorkspaceToolRequest { request_id, stage_id: "working".into(), tool_call_id: id.into(), op: Some(op) };
        self.send(Down::Tool(call)).await;
    }

    async fn tool_answer(&mut self) -> pb::WorkspaceToolResponse {
        match self.next().await {
            Up::Tool(tool) => tool,
            other => panic!("expected a tool answer, got {other:?}"),
        }
    }
}

struct FakeEdge {
    calls: mpsc::UnboundedSender<Call>,
}

#[tonic::async_trait]
impl fake_edge::FakeEdge for FakeEdge {
    async fn workspace_calls(
        &self,
        request: Request<Streaming<pb::WorkspaceUplink>>,
    ) -> Result<Response<Downlink<pb::WorkspaceDownlink>>, Status> {
        let mut up = request.into_inner();
        let Some(pb::WorkspaceUplink { msg: Some(Up::Attach(attach)) }) = up.message().await? else {
            return Err(Status::invalid_argument("attach first"));
        };
        let (down, rx) = mpsc::channel(4);
        let _ = self.calls.send(Call { attach, down, up });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    runtime: Arc<WorkspaceRuntime>,
    metrics: Arc<NodeMetrics>,
    client: NodeGatewayClient<Channel>,
    calls: mpsc::UnboundedReceiver<Call>,
}

impl Fixture {
    async fn start() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = std::fs::canonicalize(tmp.path()).unwrap();
        let root = allowed.join("site");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("notes.txt"), "notes").unwrap();
        let assignment = pb::WorkspaceAssignment {
            r#ref: "site".into(),
            root: root.to_str().unwrap().into(),
            operations: [Op::Read, Op::List, Op::Write, Op::Command].into_iter().map(Into::into).collect(),
            commands: vec![pb::WorkspaceCommandTemplate {
                id: "hang".into(),
                argv: ["sh", "-c", "sleep 300 & echo $! > grandchild.pid; wait"].map(String::from).to_vec(),
                timeout_ms: 600_000,
                limits: None,
            }],
            env_allowlist: vec!["PATH".into()],
            limits: None,
            network: false,
        };
        let (catalog, statuses) = super::super::admit(&[allowed], &|_| false, &[assignment]);
        assert_eq!(statuses[0].state(), pb::WorkspaceState::Accepted);
        let metrics = NodeMetrics::new();
        let commands = CommandEnvironment::for_tests(SandboxMode::Unsandboxed, Vec::new());
        let runtime = WorkspaceRuntime::new(GENERATION, catalog, metrics.clone(), Arc::new(commands));

        let (tx, calls) = mpsc::unbounded_channel();
        let client = fake_edge::serve(FakeEdge { calls: tx }).await;
        Self { _tmp: tmp, root, runtime, metrics, client, calls }
    }

    /// Assigns `request_id` and returns the call the node opened for it.
    async fn assign(&mut self, request_id: &str) -> Call {
        self.runtime.assign(self.client.clone(), request_id.into());
        let call = tokio::time::timeout(WAIT, self.calls.recv()).await.expect("the node opened the call").unwrap();
        assert_eq!((call.attach.request_id.as_str(), call.attach.generation), (request_id, GENERATION));
        call
    }

    fn job_dir(&self, request_id: &str) -> PathBuf {
        self.root.join(".iop/job").join(request_id)
    }

    fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics.encode();
        text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
    }
}

fn everything() -> pb::WorkspaceAuthority {
    pb::WorkspaceAuthority {
        operations: [Op::Read, Op::List, Op::Write, Op::Delete, Op::Command].into_iter().map(Into::into).collect(),
        command_ids: vec!["hang".into()],
        env_names: vec!["PATH".into()],
        limits: None,
    }
}

fn read(path: &str) -> ToolOp {
    ToolOp::Read(pb::WorkspaceRead { path: path.into(), offset: 0, max_bytes: 0 })
}

fn code(response: &pb::WorkspaceToolResponse) -> &'static str {
    response.result_label()
}

async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn alive(pid: i32) -> bool {
    crate::workspace::sandbox::running(pid)
}

async fn grandchild(root: &Path) -> i32 {
    let file = root.join("grandchild.pid");
    eventually("the grandchild's pid", || std::fs::read_to_string(&file).is_ok_and(|s| s.ends_with('\n'))).await;
    std::fs::read_to_string(&file).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn open_grants_at_most_the_catalog_and_refuses_stale_unknown_and_repeated() {
    let mut f = Fixture::start().await;
    let mut call = f.assign("r1").await;
    use pb::WorkspaceOpenStatus as S;
    assert_eq!(call.open("site", GENERATION - 1, everything()).await.status(), S::StaleGeneration);
    assert_eq!(call.open("other", GENERATION, everything()).await.status(), S::UnknownWorkspace);
    assert!(!f.job_dir("r1").exists(), "nothing is created before a successful open");

    let narrowed = pb::WorkspaceAuthority { operations: vec![Op::Read.into(), Op::Delete.into()], ..everything() };
    let opened = call.open("site", GENERATION, narrowed).await;
    assert_eq!(opened.status(), S::Opened);
    let effective = opened.effective.unwrap();
    // Delete is not in the catalog; write and command were not asked for.
    assert_eq!(effective.operations, vec![i32::from(Op::Read)]);
    assert!(f.job_dir("r1").is_dir(), "the request's state directory exists");
    assert_eq!(call.open("site", GENERATION, everything()).await.status(), S::AlreadyOpen);

    assert_eq!(code(&call.tool("t1", read("notes.txt")).await), "ok");
    let write = ToolOp::Write(pb::WorkspaceWrite { path: "x".into(), content: b"x".to_vec(), create_only: false });
    assert_eq!(code(&call.tool("t2", write).await), "denied");
    let command = ToolOp::Command(pb::WorkspaceRunCommand { command_id: "hang".into() });
    assert_eq!(code(&call.tool("t3", command).await), "denied");
    assert!(!f.root.join("x").exists());

    call.send(Down::Cleanup(pb::WorkspaceCleanupRequest { request_id: "r1".into() })).await;
    let Up::Cleanup(cleaned) = call.next().await else { panic!("expected the cleanup's answer") };
    assert_eq!(cleaned.status(), pb::WorkspaceCleanupStatus::Cleaned);
    assert!(!f.job_dir("r1").exists());
    drop(call);
    eventually("the request's call ended", || f.runtime.active() == 0).await;

    // A request id is good for one request.
    let mut again = f.assign("r1").await;
    assert_eq!(again.open("site", GENERATION, everything()).await.status(), S::AlreadyOpen);
    assert!(!f.job_dir("r1").exists());
    assert_eq!(f.metric("iop_node_workspace_cleanups_total{result=\"cleaned\"}"), 1.0);
}

#[tokio::test]
async fn one_call_at_a_time_each_id_once_and_cancel_ends_the_process_group() {
    let mut f = Fixture::start().await;
    let mut call = f.assign("r2").await;
    let not_open = call.tool("t0", read("notes.txt")).await;
    assert_eq!(code(&not_open), "not_open");
    assert_eq!(call.open("site", GENERATION, everything()).await.status(), pb::WorkspaceOpenStatus::Opened);

    call.start_tool("t1", ToolOp::Command(pb::WorkspaceRunCommand { command_id: "hang".into() })).await;
    let pid = grandchild(&f.root).await;
    assert_eq!(code(&call.tool("t2", read("notes.txt")).await), "busy");
    let foreign = pb::WorkspaceToolRequest {
        request_id: "r9".into(),
        tool_call_id: "t3".into(),
        op: Some(read("notes.txt")),
        ..Default::default()
    };
    call.send(Down::Tool(foreign)).await;
    assert_eq!(code(&call.tool_answer().await), "invalid_request");

    let cancel =
        |id: &str| Down::Cancel(pb::WorkspaceCancelRequest { request_id: "r2".into(), tool_call_id: id.into() });
    call.send(cancel("t9")).await;
    let Up::Cancel(ack) = call.next().await else { panic!("expected the cancel's answer") };
    assert_eq!(ack.status(), pb::WorkspaceCancelStatus::NotRunning);
    call.send(cancel("t1")).await;
    let mut answers = [call.next().await, call.next().await];
    answers.sort_by_key(|m| matches!(m, Up::Tool(_)));
    let [Up::Cancel(ack), Up::Tool(done)] = answers else { panic!("expected the cancel's and the call's answers") };
    assert_eq!(ack.status(), pb::WorkspaceCancelStatus::Cancelled);
    assert_eq!((done.tool_call_id.as_str(), code(&done)), ("t1", "cancelled"));
    assert!(!alive(pid), "the command's grandchild died with its group");

    assert_eq!(code(&call.tool("t1", read("notes.txt")).await), "duplicate_call");
    assert_eq!(code(&call.tool("t4", read("notes.txt")).await), "ok");
    assert_eq!(f.metric("iop_node_workspace_ops_total{op=\"command\",result=\"cancelled\"}"), 1.0);
    assert_eq!(f.metric("iop_node_workspace_ops_total{op=\"read\",result=\"busy\"}"), 1.0);
}

#[tokio::test]
async fn a_dropped_call_and_an_ended_session_clean_every_request() {
    let mut f = Fixture::start().await;
    let mut first = f.assign("r3").await;
    assert_eq!(first.open("site", GENERATION, everything()).await.status(), pb::WorkspaceOpenStatus::Opened);
    let mut second = f.assign("r4").await;
    assert_eq!(second.open("site", GENERATION, everything()).await.status(), pb::WorkspaceOpenStatus::Opened);
    second.start_tool("t1", ToolOp::Command(pb::WorkspaceRunCommand { command_id: "hang".into() })).await;
    let pid = grandchild(&f.root).await;

    // The Edge drops the first call: the node cleans that request alone.
    drop(first);
    eventually("r3 cleaned", || !f.job_dir("r3").exists()).await;
    assert!(f.job_dir("r4").exists() && alive(pid));

    // The session ends: the running command dies, then r4 is cleaned.
    f.runtime.close().await;
    assert!(!alive(pid));
    assert!(!f.job_dir("r4").exists());
    assert_eq!(f.metric("iop_node_workspace_cleanups_total{result=\"cleaned\"}"), 2.0);
    // After the session ended no new request starts.
    f.runtime.assign(f.client.clone(), "r5".into());
    assert_eq!(f.metric("iop_node_workspace_frames_dropped_total{reason=\"session_ended\"}"), 1.0);
    drop(second);
}
