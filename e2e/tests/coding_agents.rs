//! Coding agents, unmodified, at pinned versions and default settings,
//! against `iop-dev`: Claude Code (Anthropic Messages) and Codex CLI
//! (OpenAI Responses), each with a text answer and one tool round trip
//! driven by the mock's scripted turns (a shell command that writes a file,
//! checked on disk) and a tool that hands back an image. Claude Code also
//! reads a PDF (its text, not its bytes, reaches the provider; then
//! `--continue` with the PDF in the history) and answers in `stream-json`;
//! Codex also runs under a model name it knows (a `custom` patch tool, a
//! compaction). Every agent test runs behind both node adapters (Ollama's
//! and the OpenAI-compatible one).
//! Only telemetry and update checks are off, by each
//! client's documented switches, and each runs in a throwaway `HOME`.
//!
//! The clients come from npm (`@anthropic-ai/claude-code`, `@openai/codex`):
//! `scripts/test-deps --agents` installs them at the pinned versions into
//! `<cache>/agents` (or `IOP_AGENTS_DIR`); without them, their tests are
//! reported as skipped.
//!
//! Also here: the hosted tools these clients send by default (`web_search`)
//! are named in `iop-dropped-tools`, or refused under `api.hosted_tools:
//! refuse`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use iop_e2e::harness::{bin, spawn_until_lines, wait_until};
use iop_e2e::parts::{self, Part};
use serde_json::{Value, json};

/// The versions `scripts/test-deps --agents` installs (it pins the same).
const CLAUDE_CODE: &str = "2.1.332";
const CODEX: &str = "0.171.0";
/// The node adapters in front of the mock (`iop-dev --mock-adapter`, the
/// mock speaks both APIs): every agent test runs through each.
#[derive(Debug, Clone, Copy)]
enum MockAdapter {
    Ollama,
    Openai,
}

const ADAPTERS: [MockAdapter; 2] = [MockAdapter::Ollama, MockAdapter::Openai];

impl MockAdapter {
    fn flag(self) -> &'static str {
        match self {
            Self::Ollama => "ollama",
            Self::Openai => "openai",
        }
    }

    /// Where the adapter sends a chat.
    fn chat_path(self) -> &'static str {
        match self {
            Self::Ollama => "/api/chat",
            Self::Openai => "/v1/chat/completions",
        }
    }
}

/// An agent run's bound: a slow machine, never a hang.
const AGENT_TIMEOUT: Duration = Duration::from_secs(180);

const SCRIPT: &str = r#"
scripts:
  claude-bash:
    - tool_calls: [{name: Bash, arguments: {command: "echo written-by-claude > agent-out.txt", description: "Write the file"}}]
    - text: "The file is written."
  claude-image:
    - tool_calls: [{name: Read, arguments: {file_path: "PROJECT/pixel.png"}}]
    - text: "I saw the image."
  claude-pdf:
    - tool_calls: [{name: Read, arguments: {file_path: "PROJECT/report.pdf"}}]
    - text: "I read the PDF."
    - text: "The PDF is still in this conversation."
  claude-stream:
    - text: "Streamed as JSON."
  codex-exec:
    - tool_calls: [{name: exec_command, arguments: {cmd: "echo written-by-codex > agent-out.txt"}}]
    - text: "The file is written."
  codex-image:
    - tool_calls: [{name: view_image, arguments: {path: "PROJECT/pixel.png"}}]
    - text: "I saw the image."
  codex-patch:
    - tool_calls: [{name: apply_patch, arguments: {input: "*** Begin Patch\n*** Add File: agent-out.txt\n+patched-by-codex\n*** End Patch\n"}}]
    - text: "The patch is applied."
"#;

/// A 1x1 PNG, for the tools that hand an image back.
const PIXEL_PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90, 0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef,
    0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// The text layer of `report.pdf`: found in what the provider receives
/// only if the Edge read the PDF Claude Code sent.
const PDF_TEXT: &str = "Quarterly revenue rose by 7 percent in the IOP test report";

/// A fresh `iop-dev` with the scripts above, a throwaway home and project.
struct Dev {
    _dev: iop_e2e::harness::Proc,
    base: String,
    /// The mock provider's base URL (its request log: `/mock/requests`).
    mock: String,
    adapter: MockAdapter,
    dir: tempfile::TempDir,
}

impl Dev {
    async fn start(adapter: MockAdapter) -> Dev {
        Dev::serving("mock", adapter).await
    }

    /// `iop-dev` whose mock model is called `model` (as a team aliases a
    /// local model under a name the client knows), behind `adapter`.
    async fn serving(model: &str, adapter: MockAdapter) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["home", "project"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let project = dir.path().join("project");
        std::fs::write(project.join("pixel.png"), PIXEL_PNG).unwrap();
        std::fs::write(project.join("report.pdf"), one_page_pdf(PDF_TEXT)).unwrap();
        let script = dir.path().join("script.yaml");
        std::fs::write(&script, SCRIPT.replace("PROJECT", project.to_str().unwrap())).unwrap();
        let args = [
            "--http-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--mock-script-file",
            script.to_str().unwrap(),
            "--model",
            model,
            "--mock-adapter",
            adapter.flag(),
        ];
        let (dev, lines) = spawn_until_lines("iop-dev", &bin("iop-dev"), &args, "Mock provider:").await;
        let url = |marker: &str| {
            let line = lines.iter().find(|l| l.starts_with(marker)).unwrap_or_else(|| panic!("{marker} in {lines:?}"));
            line.split_whitespace().find(|w| w.starts_with("http://")).expect("a URL printed").to_string()
        };
        let base = url("IOP dev is up").trim_end_matches("/v1").to_string();
        Dev { _dev: dev, base, mock: url("Mock provider:"), adapter, dir }
    }

    /// The mock provider's request log, oldest first (`GET /mock/requests`).
    async fn provider_requests(&self) -> Vec<Value> {
        let response = http_client().get(format!("{}/mock/requests", self.mock)).send().await.unwrap();
        let log: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        log.as_array().expect("the log is an array").clone()
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    /// Runs `program args` in the project with `env`; its stdout, after
    /// asserting it succeeded.
    async fn run(&self, program: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(self.project())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(AGENT_TIMEOUT, command.output())
            .await
            .unwrap_or_else(|_| panic!("{} did not finish in {AGENT_TIMEOUT:?}", program.display()))
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{} failed ({}):\n{stdout}\n{stderr}", program.display(), output.status);
        stdout.into_owned()
    }

    fn written(&self) -> Option<String> {
        std::fs::read_to_string(self.project().join("agent-out.txt")).ok()
    }
}

/// docs/clients.md's Codex setup in the test's home: IOP as a model provider
/// speaking Responses (Codex's only wire API) serving `model`; update checks
/// and analytics off.
fn write_codex_config(dev: &Dev, model: &str) {
    let config = format!(
        "model = \"{model}\"\nmodel_provider = \"iop\"\ncheck_for_update_on_startup = false\n\n\
         [analytics]\nenabled = false\n\n\
         [model_providers.iop]\nname = \"IOP\"\nbase_url = \"{}/v1\"\nenv_key = \"IOP_API_KEY\"\nwire_api = \"responses\"\n",
        dev.base
    );
    std::fs::create_dir(dev.home().join(".codex")).unwrap();
    std::fs::write(dev.home().join(".codex/config.toml"), config).unwrap();
}

/// Claude Code's documented switches for telemetry, error reports and
/// update checks (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` covers all three).
fn claude_env(base: &str) -> [(&str, &str); 4] {
    [
        ("ANTHROPIC_BASE_URL", base),
        ("ANTHROPIC_API_KEY", "unused-without-keys"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
    ]
}

#[tokio::test]
#[cfg_attr(iop_absent_coding_agents, ignore = "needs Claude Code and Codex: scripts/test-deps --agents")]
async fn claude_code_answers_and_runs_a_tool_through_iop() {
    let claude = Part::CodingAgents.require(parts::agent("claude"));
    for adapter in ADAPTERS {
        let dev = Dev::start(adapter).await;
        let version = dev.run(&claude, &["--version"], &[]).await;
        assert!(version.starts_with(CLAUDE_CODE), "the pinned version: {version}");
        let env = claude_env(&dev.base);

        // Default settings: an unknown model name, adaptive thinking, a system
        // turn inside the conversation, deferred tools.
        let answer = dev.run(&claude, &["-p", "Say hello", "--model", "mock"], &env).await;
        assert!(answer.contains("Hello from the IOP mock provider."), "{adapter:?}: {answer}");

        // One tool round trip: the mock asks for Bash, Claude Code runs it (the
        // one tool allowed without a prompt) and sends the result back.
        let args = ["-p", "iop-mock-script:claude-bash write the file", "--model", "mock", "--allowedTools", "Bash"];
        let answer = dev.run(&claude, &args, &env).await;
        assert!(answer.contains("The file is written."), "{adapter:?}: {answer}");
        assert_eq!(dev.written().as_deref(), Some("written-by-claude\n"), "{adapter:?}");

        // Read of an image: the tool result carries an image block.
        let args = ["-p", "iop-mock-script:claude-image look", "--model", "mock", "--allowedTools", "Read"];
        let answer = dev.run(&claude, &args, &env).await;
        assert!(answer.contains("I saw the image."), "{adapter:?}: {answer}");
    }
}

/// Claude Code's Read of a PDF hands the file back as a `document` block
/// inside the `tool_result`; the Edge reads it into its text layer
/// (`edge/src/ingress/documents.rs`), which is what the provider gets, never
/// the PDF's bytes. `claude -p --continue` then sends the conversation
/// again, the block still in it, and it is read again.
#[tokio::test]
#[cfg_attr(iop_absent_coding_agents, ignore = "needs Claude Code and Codex: scripts/test-deps --agents")]
async fn claude_code_reads_a_pdf_through_iop() {
    let claude = Part::CodingAgents.require(parts::agent("claude"));
    for adapter in ADAPTERS {
        let dev = Dev::start(adapter).await;
        let env = claude_env(&dev.base);

        let args = ["-p", "iop-mock-script:claude-pdf read the report", "--model", "mock", "--allowedTools", "Read"];
        let answer = dev.run(&claude, &args, &env).await;
        assert!(answer.contains("I read the PDF."), "{adapter:?}: {answer}");
        let requests = dev.provider_requests().await;
        assert_eq!(pdf_reads(adapter, &requests), 1, "{adapter:?}: {requests:#?}");

        let args = ["-p", "--continue", "and now?", "--model", "mock", "--allowedTools", "Read"];
        let answer = dev.run(&claude, &args, &env).await;
        assert!(answer.contains("The PDF is still in this conversation."), "{adapter:?}: {answer}");
        let requests = dev.provider_requests().await;
        assert_eq!(pdf_reads(adapter, &requests), 2, "{adapter:?}: {requests:#?}");
    }
}

/// How many chat requests the provider got carry a tool result that is the
/// PDF read into text (labelled as the Edge labels a document); and no
/// request carries the PDF's bytes (base64 of `%PDF-`).
fn pdf_reads(adapter: MockAdapter, requests: &[Value]) -> usize {
    for request in requests {
        assert!(!request["body"].to_string().contains("JVBERi0"), "the PDF's bytes reached the provider: {request}");
    }
    let chats = requests.iter().filter(|r| r["path"] == adapter.chat_path());
    chats
        .filter(|r| {
            let messages = r["body"]["messages"].as_array().expect("a chat request");
            messages.iter().any(|m| {
                // A string on both APIs (OpenAI's content parts, if ever: their text).
                let content = match &m["content"] {
                    Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<String>(),
                    other => other.as_str().unwrap_or_default().to_string(),
                };
                m["role"] == "tool" && content.contains(r#"type="PDF" pages="1">"#) && content.contains(PDF_TEXT)
            })
        })
        .count()
}

/// `--output-format stream-json --verbose`, as an IDE or a script drives
/// Claude Code (it then asks for `thinking: {"type": "adaptive", "display":
/// "updates"}`): every stdout line is a JSON event, the thinking comes back
/// with its text, the last event is a successful `result` with the scripted
/// answer, and nothing was retried (no `api_retry` event, no error status,
/// one chat request reached the provider).
#[tokio::test]
#[cfg_attr(iop_absent_coding_agents, ignore = "needs Claude Code and Codex: scripts/test-deps --agents")]
async fn claude_code_streams_json_through_iop() {
    let claude = Part::CodingAgents.require(parts::agent("claude"));
    for adapter in ADAPTERS {
        claude_code_streams_json_through(&claude, Dev::start(adapter).await).await;
    }
}

async fn claude_code_streams_json_through(claude: &Path, dev: Dev) {
    let adapter = dev.adapter;
    let args = [
        "-p",
        "iop-mock-script:claude-stream say hello",
        "--model",
        "mock",
        "--output-format",
        "stream-json",
        "--verbose",
    ];
    let stdout = dev.run(claude, &args, &claude_env(&dev.base)).await;
    let events: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON event ({e}): {line}")))
        .collect();
    let kinds: Vec<(&str, &str)> =
        events.iter().map(|e| (e["type"].as_str().unwrap_or("?"), e["subtype"].as_str().unwrap_or(""))).collect();
    assert_eq!(kinds.first(), Some(&("system", "init")), "{adapter:?}: {stdout}");
    assert!(!kinds.iter().any(|(_, subtype)| *subtype == "api_retry"), "{adapter:?}: {stdout}");

    let blocks = events
        .iter()
        .filter(|e| e["type"] == "assistant")
        .flat_map(|e| e["message"]["content"].as_array().expect("an assistant message's content").iter());
    let thinking: Vec<&str> =
        blocks.filter(|b| b["type"] == "thinking").map(|b| b["thinking"].as_str().unwrap()).collect();
    assert!(matches!(thinking[..], [t] if t.starts_with("Thinking about: ")), "{adapter:?}: {thinking:?}");

    let result = events.last().expect("events");
    assert_eq!(
        (&result["type"], &result["subtype"], &result["is_error"], &result["api_error_status"]),
        (&json!("result"), &json!("success"), &json!(false), &json!(null)),
        "{adapter:?}: {result}"
    );
    assert_eq!(result["result"], "Streamed as JSON.", "{adapter:?}: {result}");
    let requests = dev.provider_requests().await;
    let chats = requests.iter().filter(|r| r["path"] == adapter.chat_path()).count();
    assert_eq!(chats, 1, "{adapter:?}: {requests:#?}");
}

#[tokio::test]
#[cfg_attr(iop_absent_coding_agents, ignore = "needs Claude Code and Codex: scripts/test-deps --agents")]
async fn codex_cli_answers_and_runs_a_tool_through_iop() {
    let codex = Part::CodingAgents.require(parts::agent("codex"));
    for adapter in ADAPTERS {
        let dev = Dev::start(adapter).await;
        let version = dev.run(&codex, &["--version"], &[]).await;
        assert!(version.contains(CODEX), "the pinned version: {version}");
        write_codex_config(&dev, "mock");
        let env = [("IOP_API_KEY", "unused-without-keys")];

        // Default tools: a `namespace` tool and the hosted `web_search`.
        let answer = dev.run(&codex, &["exec", "--skip-git-repo-check", "Say hello"], &env).await;
        assert!(answer.contains("Hello from the IOP mock provider. You said: Say hello"), "{adapter:?}: {answer}");

        // One tool round trip: exec_command in Codex's own workspace-write sandbox.
        let args = [
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "workspace-write",
            "iop-mock-script:codex-exec write the file",
        ];
        let answer = dev.run(&codex, &args, &env).await;
        assert!(answer.contains("The file is written."), "{adapter:?}: {answer}");
        assert_eq!(dev.written().as_deref(), Some("written-by-codex\n"), "{adapter:?}");

        // view_image: the function_call_output carries an input_image.
        let args = ["exec", "--skip-git-repo-check", "iop-mock-script:codex-image look"];
        let answer = dev.run(&codex, &args, &env).await;
        assert!(answer.contains("I saw the image."), "{adapter:?}: {answer}");
    }
}

/// Issue 45 item 4 (and the compaction of item 3): under a model name Codex
/// knows it sends `apply_patch` as a `custom` grammar tool and a
/// `tool_search` tool. The model's call comes back as a `custom_tool_call`,
/// Codex applies the patch (checked on disk) and hands back a
/// `custom_tool_call_output`; a small `model_auto_compact_token_limit` makes
/// it compact mid-turn (`tools: []` with `parallel_tool_calls: false`) and
/// go on, through either adapter.
#[tokio::test]
#[cfg_attr(iop_absent_coding_agents, ignore = "needs Claude Code and Codex: scripts/test-deps --agents")]
async fn codex_cli_under_a_known_model_name_patches_and_compacts() {
    let codex = Part::CodingAgents.require(parts::agent("codex"));
    for adapter in ADAPTERS {
        codex_patches_and_compacts(&codex, Dev::serving("gpt-5.5", adapter).await).await;
    }
}

async fn codex_patches_and_compacts(codex: &Path, dev: Dev) {
    write_codex_config(&dev, "gpt-5.5");
    let env = [("IOP_API_KEY", "unused-without-keys")];
    let args = [
        "exec",
        "-c",
        "model_auto_compact_token_limit=1000",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        "iop-mock-script:codex-patch add the file",
    ];
    let answer = dev.run(codex, &args, &env).await;
    assert!(answer.contains("The patch is applied."), "{:?}: {answer}", dev.adapter);
    assert_eq!(dev.written().as_deref(), Some("patched-by-codex\n"), "{:?}", dev.adapter);
    // Codex's session log records the compaction.
    fn rollouts(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rollouts(&path, out);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                out.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut sessions = Vec::new();
    rollouts(&dev.home().join(".codex/sessions"), &mut sessions);
    assert!(
        sessions.iter().any(|s| s.contains(r#""type":"compacted""#)),
        "{:?}: no compaction in {} sessions",
        dev.adapter,
        sessions.len()
    );
}

/// A Responses request with Codex's hosted tool, and an Anthropic request
/// with a server tool: served without them (the header names them), then
/// refused once the Edge's config says `api.hosted_tools: refuse`.
#[tokio::test]
async fn hosted_tools_are_dropped_and_named_or_refused_by_config() {
    let stack = Stack::start(StackOptions::default()).await;
    let responses = json!({"model": "mock-ollama", "input": "hi", "tools": [
        {"type": "function", "name": "exec", "parameters": {"type": "object"}},
        {"type": "web_search", "external_web_access": false},
    ]});
    let messages = json!({"model": "mock-ollama", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "web_search_20250305", "name": "web_search"}, {"type": "web_fetch_20250910", "name": "web_fetch"},
    ]});
    let send = |path: &'static str, body: Value| {
        let stack = &stack;
        async move {
            let response = stack.post(path, &body).await;
            let header = response.headers().get("iop-dropped-tools").map(|v| v.to_str().unwrap().to_string());
            let (status, body) = json_body(response).await;
            (status, header, body)
        }
    };
    let (status, header, body) = send("/v1/responses", responses.clone()).await;
    assert_eq!((status, header.as_deref()), (200, Some("web_search")), "{body}");
    let provider = stack.last_provider_request("/api/chat").await;
    let offered: Vec<&str> =
        provider["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["exec"], "the provider is offered only the function");
    let (status, header, _) = send("/v1/messages", messages.clone()).await;
    assert_eq!((status, header.as_deref()), (200, Some("web_search, web_fetch")));
    let (status, header, _) = send("/v1/chat/completions", chat_body("mock-ollama", "hi", false)).await;
    assert_eq!((status, header), (200, None), "nothing dropped, no header");

    let mut config =
        iop_proto::config::EdgeConfig::from_yaml(&std::fs::read_to_string(&stack.edge_config).unwrap()).unwrap();
    config.api.hosted_tools = iop_proto::config::HostedTools::Refuse;
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    wait_until("the reload is applied", Duration::from_secs(10), || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"] == 2
    })
    .await;
    let (status, header, body) = send("/v1/responses", responses).await;
    assert_eq!((status, header), (400, None));
    assert_eq!(body["error"]["param"], "tools[1]");
    assert!(body["error"]["message"].as_str().unwrap().contains("`web_search` is a hosted tool"), "{body}");
    let (status, _, body) = send("/v1/messages", messages).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("tools.0: `web_search` is a hosted tool"), "{body}");
}
