//! The workspace call of one request (`NodeGateway.WorkspaceCalls`).
//!
//! A Ready session that receives `WorkspaceAssign` opens the request's own
//! call (first frame `WorkspaceAttach`: request id and generation), so file
//! contents and command output never share a stream with runs. On it the
//! Edge sends, in order: one `Open` (the workspace ref and the Edge's frozen
//! authority, narrowed here by the catalog: [`super::authority`]), any
//! number of `Tool` calls (one at a time; each id once), `Cancel` for the
//! running call, and one `Cleanup` that ends the request. Every request is
//! cleaned exactly once however its call ends: by `Cleanup`, by the Edge
//! dropping the call, or by the session ending ([`WorkspaceRuntime::close`]).
//! The running call is cancelled (every process a command started ends) and
//! awaited before the cleanup starts.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iop_proto::pb::{self, WorkspaceOperation as Op, node_gateway_client::NodeGatewayClient};
use iop_proto::pb::{WorkspaceToolErrorCode as Code, workspace_tool_response::Result as ToolResult};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::authority::{Template, effective};
use super::cleanup::{self, CleanupCache, CleanupOutcome};
use super::command::{self, CommandError, CommandSpec, Exit};
use super::files::{EntryKind, FileError, FileLimits, Files};
use super::sandbox::CommandEnvironment;
use super::{Workspace, WorkspaceCatalog};
use crate::metrics::NodeMetrics;

/// How long a session's end waits for its requests to cancel and clean.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// How long a finished request waits for the Edge to end its call.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// The workspace requests of one session.
pub struct WorkspaceRuntime {
    generation: u64,
    catalog: WorkspaceCatalog,
    cleanups: CleanupCache,
    metrics: Arc<NodeMetrics>,
    commands: Arc<CommandEnvironment>,
    requests: Mutex<HashMap<String, JoinHandle<()>>>,
    /// Cancelled when the session ends: every request stops and cleans.
    stop: CancellationToken,
}

impl WorkspaceRuntime {
    pub fn new(
        generation: u64,
        catalog: WorkspaceCatalog,
        metrics: Arc<NodeMetrics>,
        commands: Arc<CommandEnvironment>,
    ) -> Arc<Self> {
        Arc::new(Self {
            generation,
            catalog,
            cleanups: CleanupCache::default(),
            metrics,
            commands,
            requests: Mutex::default(),
            stop: CancellationToken::new(),
        })
    }

    /// Opens the call of request `request_id`; an id whose call is still
    /// being served is refused (and counted).
    pub fn assign(self: &Arc<Self>, client: NodeGatewayClient<Channel>, request_id: String) {
        let mut requests = self.requests.lock().unwrap();
        requests.retain(|_, task| !task.is_finished());
        if self.stop.is_cancelled() {
            self.metrics.workspace_frame_dropped("session_ended");
            return;
        }
        if requests.contains_key(&request_id) {
            self.metrics.workspace_frame_dropped("duplicate_request");
            return;
        }
        let task = tokio::spawn(self.clone().serve(client, request_id.clone()));
        requests.insert(request_id, task);
    }

    /// Requests whose call is still being served.
    pub fn active(&self) -> usize {
        self.requests.lock().unwrap().values().filter(|task| !task.is_finished()).count()
    }

    /// The session ended: stops every request and waits (bounded) while
    /// each cancels its running call and cleans its state.
    pub async fn close(&self) {
        self.stop.cancel();
        let tasks: Vec<_> = self.requests.lock().unwrap().drain().map(|(_, task)| task).collect();
        if tokio::time::timeout(CLOSE_WAIT, futures_util::future::join_all(tasks)).await.is_err() {
            tracing::warn!(generation = self.generation, "workspace requests still cleaning after the session ended");
        }
    }

    async fn serve(self: Arc<Self>, mut client: NodeGatewayClient<Channel>, request_id: String) {
        let (uplink, rx) = mpsc::channel(4);
        let attach = pb::workspace_uplink::Msg::Attach(pb::WorkspaceAttach {
            request_id: request_id.clone(),
            generation: self.generation,
        });
        let _ = uplink.try_send(pb::WorkspaceUplink { msg: Some(attach) });
        let call = tokio::select! {
            _ = self.stop.cancelled() => return,
            call = client.workspace_calls(ReceiverStream::new(rx)) => call,
        };
        let mut inbound = match call {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tracing::warn!(code = ?status.code(), "the edge refused a workspace call");
                return;
            }
        };
        let mut request = Request { id: request_id, opened: None, used: HashSet::new() };
        let mut running: Option<Running> = None;
        loop {
            let finished = async {
                match running.as_mut() {
                    Some(r) => (&mut r.result).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                response = finished => {
                    running = None;
                    send(&uplink, pb::workspace_uplink::Msg::Tool(response)).await;
                }
                message = inbound.message() => {
                    let msg = match message {
                        Ok(Some(pb::WorkspaceDownlink { msg: Some(msg) })) => msg,
                        Ok(Some(_)) => {
                            self.metrics.workspace_frame_dropped("empty_message");
                            continue;
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(code = ?status.code(), message = status.message(), "a workspace call failed");
                            break;
                        }
                    };
                    use pb::workspace_downlink::Msg as Down;
                    match msg {
                        Down::Open(open) => {
                            let response = self.open(&mut request, open);
                            send(&uplink, pb::workspace_uplink::Msg::Open(response)).await;
                        }
                        Down::Tool(call) => match request.admit(&call, running.is_some()) {
                            Ok(opened) => running = Some(self.start(opened, call)),
                            Err(code) => {
                                send(&uplink, pb::workspace_uplink::Msg::Tool(self.refuse(&call, code))).await;
                            }
                        },
                        Down::Cancel(cancel) => {
                            let status = match &running {
                                Some(r) if cancel.request_id == request.id && r.tool_call_id == cancel.tool_call_id => {
                                    r.cancel.cancel();
                                    pb::WorkspaceCancelStatus::Cancelled
                                }
                                _ => pb::WorkspaceCancelStatus::NotRunning,
                            };
                            let response = pb::WorkspaceCancelResponse {
                                request_id: request.id.clone(),
                                tool_call_id: cancel.tool_call_id,
                                status: status.into(),
                            };
                            send(&uplink, pb::workspace_uplink::Msg::Cancel(response)).await;
                        }
                        Down::Cleanup(cleanup) if cleanup.request_id != request.id => {
                            self.metrics.workspace_frame_dropped("wrong_request");
                        }
                        Down::Cleanup(_) => {
                            if let Some(r) = running.take() {
                                let response = r.finish().await;
                                send(&uplink, pb::workspace_uplink::Msg::Tool(response)).await;
                            }
                            let response = self.clean(&mut request).await;
                            send(&uplink, pb::workspace_uplink::Msg::Cleanup(response)).await;
                            break;
                        }
                    }
                }
            }
        }
        // However the call ended: the running call dies first, then the
        // request's state goes (once; a Cleanup already did it).
        if let Some(r) = running.take() {
            r.finish().await;
        }
        self.clean(&mut request).await;
        // Ending the uplink and waiting for the Edge to end the call lets
        // the last answer through: dropping the call would reset it. (Not
        // when the session ended: its connection is gone.)
        drop(uplink);
        if !self.stop.is_cancelled() {
            let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
            let _ = tokio::time::timeout(ACK_WAIT, drained).await;
        }
    }

    fn open(&self, request: &mut Request, open: pb::WorkspaceOpenRequest) -> pb::WorkspaceOpenResponse {
        use pb::WorkspaceOpenStatus as S;
        let refused = |status: S| pb::WorkspaceOpenResponse {
            request_id: request.id.clone(),
            status: status.into(),
            effective: None,
        };
        let outcome = if open.request_id != request.id {
            Err(S::InvalidRequest)
        } else if open.generation != self.generation {
            Err(S::StaleGeneration)
        } else if request.opened.is_some() || self.cleanups.seen(&request.id) {
            // Opened on this call, or an earlier request's id: never twice.
            Err(S::AlreadyOpen)
        } else {
            match self.catalog.get(&open.r#ref) {
                None => Err(S::UnknownWorkspace),
                Some(workspace) => {
                    let authority = effective(&workspace.template, &open.authority.unwrap_or_default());
                    match cleanup::create(&workspace.dir, &request.id) {
                        Ok(()) => Ok((workspace.clone(), authority)),
                        Err(_) => Err(S::Failed),
                    }
                }
            }
        };
        let label = match &outcome {
            Ok(_) => "ok",
            Err(status) => open_label(*status),
        };
        self.metrics.workspace_op("open", label, Duration::ZERO);
        match outcome {
            Ok((workspace, authority)) => {
                let response = pb::WorkspaceOpenResponse {
                    request_id: request.id.clone(),
                    status: S::Opened.into(),
                    effective: Some(authority.to_wire()),
                };
                request.opened = Some(Opened { workspace, authority: Arc::new(authority) });
                response
            }
            Err(status) => refused(status),
        }
    }

    /// Starts an admitted call on its own task (file operations on a
    /// blocking thread), cancellable until it ends.
    fn start(self: &Arc<Self>, opened: Opened, call: pb::WorkspaceToolRequest) -> Running {
        let cancel = CancellationToken::new();
        let (op, label) = operation(&call);
        let started = Instant::now();
        let token = cancel.clone();
        let (workspace, authority) = (opened.workspace, opened.authority);
        let (commands, metrics) = (self.commands.clone(), self.metrics.clone());
        let work = async move {
            let limits = authority.limits;
            let files = FileLimits { max_file_bytes: limits.max_file_bytes, max_list_entries: limits.max_list_entries };
            let blocking = |f: FileOp| {
                let workspace = workspace.clone();
                async move {
                    let done = tokio::task::spawn_blocking(move || f(&Files::new(&workspace.dir, files)?)).await;
                    done.unwrap_or(Err(FileError::Io)).unwrap_or_else(|e| error(file_code(e)))
                }
            };
            use pb::workspace_tool_request::Op as O;
            match op {
                Some(O::Read(r)) => {
                    let cap = limits.max_output_bytes;
                    let max = if r.max_bytes == 0 { cap } else { r.max_bytes.min(cap) };
                    blocking(Box::new(move |files| {
                        let read = files.read(&r.path, r.offset, max)?;
                        Ok(ToolResult::Read(pb::WorkspaceReadResult {
                            content: read.data,
                            truncated: read.truncated,
                            size: read.size,
                        }))
                    }))
                    .await
                }
                Some(O::List(l)) => {
                    blocking(Box::new(move |files| {
                        let cursor = (!l.cursor.is_empty()).then_some(l.cursor.as_str());
                        let listed = files.list(&l.path, cursor)?;
                        Ok(ToolResult::List(pb::WorkspaceListResult {
                            entries: listed
                                .entries
                                .into_iter()
                                .map(|e| pb::WorkspaceListEntry { name: e.name, kind: entry_kind(e.kind).into() })
                                .collect(),
                            next_cursor: listed.next.unwrap_or_default(),
                        }))
                    }))
                    .await
                }
                Some(O::Write(w)) => {
                    blocking(Box::new(move |files| {
                        files.write(&w.path, &w.content, w.create_only)?;
                        Ok(ToolResult::Write(pb::WorkspaceDone {}))
                    }))
                    .await
                }
                Some(O::Delete(d)) => {
                    blocking(Box::new(move |files| {
                        files.delete(&d.path)?;
                        Ok(ToolResult::Delete(pb::WorkspaceDone {}))
                    }))
                    .await
                }
                Some(O::Command(c)) => {
                    let Some(template) = authority.commands.get(&c.command_id) else { return error(Code::Denied) };
                    let Ok(policy) = commands.policy(&workspace.root, authority.network) else {
                        return error(Code::SandboxUnavailable);
                    };
                    let spec = CommandSpec {
                        argv: &template.argv,
                        env_allowlist: &authority.env_allowlist,
                        timeout: template.timeout.min(Duration::from_millis(limits.wall_clock_ms)),
                        max_output_bytes: usize::try_from(limits.max_output_bytes).unwrap_or(usize::MAX),
                        grace: command::TERM_GRACE,
                        supervisor: &commands.supervisor,
                        policy: policy.as_ref(),
                        user: commands.user,
                        limits: template.limits,
                    };
                    match command::run(&workspace.dir, &spec, &token).await {
                        Ok(done) => ToolResult::Command(pb::WorkspaceCommandResult {
                            exit_code: match done.exit {
                                Exit::Code(code) => Some(code),
                                Exit::Signal(_) => None,
                            },
                            signal: match done.exit {
                                Exit::Signal(signal) => Some(signal),
                                Exit::Code(_) => None,
                            },
                            timed_out: done.timed_out,
                            cancelled: done.cancelled,
                            output: done.output,
                            truncated: done.truncated,
                            duration_ms: done.duration.as_millis() as u64,
                            limit_exceeded: done.limit_exceeded.map_or(0, |limit| {
                                metrics.command_limit_exceeded(limit);
                                limit.into()
                            }),
                        }),
                        Err(CommandError::EmptyArgv | CommandError::SpawnFailed) => error(Code::SpawnFailed),
                        Err(CommandError::SandboxFailed) => error(Code::SandboxFailed),
                    }
                }
                None => error(Code::InvalidRequest),
            }
        };
        let runtime = self.clone();
        let answer = pb::WorkspaceToolResponse {
            request_id: call.request_id,
            stage_id: call.stage_id,
            tool_call_id: call.tool_call_id.clone(),
            result: None,
        };
        // The call's task panicking still answers it.
        let failed = pb::WorkspaceToolResponse { result: Some(error(Code::Io)), ..answer.clone() };
        let result = tokio::spawn(async move {
            let response = pb::WorkspaceToolResponse { result: Some(work.await), ..answer };
            runtime.metrics.workspace_op(label, response.result_label(), started.elapsed());
            response
        });
        Running {
            tool_call_id: call.tool_call_id,
            cancel,
            result: Box::pin(async move { result.await.unwrap_or(failed) }),
        }
    }

    /// A refused call's answer (counted under its operation).
    fn refuse(&self, call: &pb::WorkspaceToolRequest, code: Code) -> pb::WorkspaceToolResponse {
        let response = pb::WorkspaceToolResponse {
            request_id: call.request_id.clone(),
            stage_id: call.stage_id.clone(),
            tool_call_id: call.tool_call_id.clone(),
            result: Some(error(code)),
        };
        self.metrics.workspace_op(operation(call).1, response.result_label(), Duration::ZERO);
        response
    }

    /// Cleans an opened request (once: it is then no longer open).
    async fn clean(&self, request: &mut Request) -> pb::WorkspaceCleanupResponse {
        use pb::WorkspaceCleanupStatus as S;
        let mut response = pb::WorkspaceCleanupResponse { request_id: request.id.clone(), ..Default::default() };
        let Some(opened) = request.opened.take() else {
            response.status = S::NotOpen.into();
            return response;
        };
        let outcome = self.cleanups.clean(&opened.workspace.dir, &request.id).await;
        self.metrics.workspace_cleanup(outcome.label());
        let (status, removed, refused) = match outcome {
            CleanupOutcome::NothingToClean => (S::NothingToClean, 0, 0),
            CleanupOutcome::Cleaned { removed } => (S::Cleaned, removed, 0),
            CleanupOutcome::Partial { removed, refused } => {
                // The kinds only (closed labels), never a name.
                let kinds: Vec<String> = refused.iter().map(|(why, n)| format!("{}={n}", why.label())).collect();
                tracing::warn!(refused = %kinds.join(","), "workspace cleanup left entries in place");
                (S::Partial, removed, refused.values().sum())
            }
            CleanupOutcome::InvalidRequestId | CleanupOutcome::Failed => (S::Failed, 0, 0),
        };
        response.status = status.into();
        response.removed = removed;
        response.refused = refused;
        response
    }
}

/// A file operation, run on a blocking thread.
type FileOp = Box<dyn FnOnce(&Files) -> Result<ToolResult, FileError> + Send>;

/// An opened request's workspace and what it was granted.
#[derive(Clone)]
struct Opened {
    workspace: Arc<Workspace>,
    authority: Arc<Template>,
}

/// One request on its call.
struct Request {
    id: String,
    opened: Option<Opened>,
    /// Tool call ids seen (each may run once).
    used: HashSet<String>,
}

impl Request {
    /// Whether `call` may start now; checked before any effect.
    fn admit(&mut self, call: &pb::WorkspaceToolRequest, busy: bool) -> Result<Opened, Code> {
        if call.request_id != self.id || call.tool_call_id.is_empty() {
            return Err(Code::InvalidRequest);
        }
        let opened = self.opened.clone().ok_or(Code::NotOpen)?;
        if busy {
            return Err(Code::Busy);
        }
        if !self.used.insert(call.tool_call_id.clone()) {
            return Err(Code::DuplicateCall);
        }
        use pb::workspace_tool_request::Op as O;
        let needed = match &call.op {
            Some(O::Read(_)) => Op::Read,
            Some(O::List(_)) => Op::List,
            Some(O::Write(_)) => Op::Write,
            Some(O::Delete(_)) => Op::Delete,
            Some(O::Command(c)) => {
                if !opened.authority.commands.contains_key(&c.command_id) {
                    return Err(Code::Denied);
                }
                Op::Command
            }
            None => return Err(Code::InvalidRequest),
        };
        if !opened.authority.allows(needed) {
            return Err(Code::Denied);
        }
        Ok(opened)
    }
}

/// The call running on a request.
struct Running {
    tool_call_id: String,
    cancel: CancellationToken,
    result: Pin<Box<dyn Future<Output = pb::WorkspaceToolResponse> + Send>>,
}

impl Running {
    /// Cancels the call and waits for its (cancelled) answer.
    async fn finish(self) -> pb::WorkspaceToolResponse {
        self.cancel.cancel();
        self.result.await
    }
}

async fn send(uplink: &mpsc::Sender<pb::WorkspaceUplink>, msg: pb::workspace_uplink::Msg) {
    // A closed uplink means the Edge dropped the call; the loop sees the
    // downlink end next.
    let _ = uplink.send(pb::WorkspaceUplink { msg: Some(msg) }).await;
}

fn error(code: Code) -> ToolResult {
    ToolResult::Error(pb::WorkspaceToolError { code: code.into() })
}

/// The call's operation and its metric label.
fn operation(call: &pb::WorkspaceToolRequest) -> (Option<pb::workspace_tool_request::Op>, &'static str) {
    use pb::workspace_tool_request::Op as O;
    let label = match &call.op {
        Some(O::Read(_)) => "read",
        Some(O::List(_)) => "list",
        Some(O::Write(_)) => "write",
        Some(O::Delete(_)) => "delete",
        Some(O::Command(_)) => "command",
        None => "unknown",
    };
    (call.op.clone(), label)
}

fn open_label(status: pb::WorkspaceOpenStatus) -> &'static str {
    use pb::WorkspaceOpenStatus as S;
    match status {
        S::Opened => "ok",
        S::UnknownWorkspace => "unknown_workspace",
        S::AlreadyOpen => "already_open",
        S::StaleGeneration => "stale_generation",
        S::InvalidRequest | S::Unspecified => "invalid_request",
        S::Failed => "failed",
    }
}

fn file_code(e: FileError) -> Code {
    match e {
        FileError::InvalidPath(_) => Code::InvalidPath,
        FileError::Reserved => Code::Reserved,
        FileError::NotFound => Code::NotFound,
        FileError::Symlink => Code::Symlink,
        FileError::CrossDevice => Code::CrossDevice,
        FileError::NotADirectory => Code::NotADirectory,
        FileError::IsADirectory => Code::IsADirectory,
        FileError::SpecialFile => Code::SpecialFile,
        FileError::Exists => Code::Exists,
        FileError::NotEmpty => Code::NotEmpty,
        FileError::TooLarge => Code::TooLarge,
        FileError::ParentChanged => Code::ParentChanged,
        FileError::Io => Code::Io,
    }
}

fn entry_kind(kind: EntryKind) -> pb::WorkspaceEntryKind {
    match kind {
        EntryKind::File => pb::WorkspaceEntryKind::File,
        EntryKind::Directory => pb::WorkspaceEntryKind::Directory,
        EntryKind::Symlink => pb::WorkspaceEntryKind::Symlink,
        EntryKind::Other => pb::WorkspaceEntryKind::Other,
    }
}

#[cfg(test)]
mod tests;
