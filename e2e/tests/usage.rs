//! Usage a team can bill from (issue 42), through real `iop-edge` and
//! `iop-node` processes and the official SDKs: every attempt is charged
//! what it used however it ended (a dropped stream, a client that gave up
//! during the prefill), a node's report is bounded by what its run could
//! have used, and tokens per minute are reserved before an answer and
//! settled after it.

mod common;

use common::fake_node::*;
use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::pb::{self, run_event, run_uplink::Frame};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// The prompt of `e2e/sdk/usage_truth.py`, as the node estimates it.
fn story_estimate() -> u64 {
    let message = pb::ChatMessage { content: "tell me a long story".into(), ..Default::default() };
    iop_proto::usage::estimate_input_tokens(&[message], &[])
}

/// `principal`'s totals in `GET /admin/v1/usage`.
async fn totals(stack: &Stack, principal: &str) -> Value {
    stack.get_json("/admin/v1/usage").await["principals"][principal].clone()
}

fn keys_with(name: &str, limits: &str) -> (String, String) {
    let (key, entry) = new_key(name, &[]);
    (key, format!("principals:\n{}\n", entry.replace(&format!("name: {name},"), &format!("name: {name}, {limits},"))))
}

/// Streams dropped by their clients after `N` deltas are charged the `N`
/// output tokens their node counted (the mock reports usage only at its
/// end, which never comes) and their prompts' estimates; once they fill
/// the key's tokens per minute, its next request is refused.
#[tokio::test]
async fn dropped_streams_are_charged_what_was_generated() {
    const N: u64 = 12;
    let (key, keys) = keys_with("dropper", "tokens_per_minute: 30");
    // Through the Ollama adapter: no tokenizer, so the prompt is estimated.
    let stalls = provider("stalls", iop_proto::config::Adapter::Ollama, "mock@words=400,stall_after=12", "story", "");
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![stalls], ..Default::default() }).await;
    let base = stack.url("");
    run_script("usage_truth.py", &["drop", base.trim_end_matches('/'), &key, "story", &N.to_string()]).await;

    wait_until("both dropped streams charged", WAIT, || async {
        totals(&stack, "dropper").await["output_tokens"].as_u64() == Some(2 * N)
    })
    .await;
    let dropper = totals(&stack, "dropper").await;
    assert_eq!(dropper["output_tokens_unreported"], 2 * N, "{dropper}");
    assert_eq!(dropper["input_tokens"], 2 * story_estimate(), "{dropper}");
    assert_eq!(dropper["input_tokens_unreported"], 2 * story_estimate(), "{dropper}");
    let counted = "iop_edge_tokens_total{principal=\"dropper\",model=\"story\",kind=\"output\",source=\"counted\"}";
    assert_eq!(stack.metric(counted).await, (2 * N) as f64);
    let estimated = "iop_edge_tokens_total{principal=\"dropper\",model=\"story\",kind=\"input\",source=\"estimated\"}";
    assert_eq!(stack.metric(estimated).await, (2 * story_estimate()) as f64);

    // 2 x (12 + the estimate) is past the 30 a minute: not free any more.
    let (status, body) =
        json_body(stack.post_as(&key, "/v1/chat/completions", &chat_body("story", "again", false)).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("tokens")), "{body}");
}

/// A client that gives up while the provider reads its prompt (before the
/// first token) is charged the prompt's estimate: the provider spent it.
#[tokio::test]
async fn a_prefill_the_client_gave_up_on_is_charged_its_input() {
    let (key, keys) = keys_with("impatient", "tokens_per_minute: 100000");
    let slow = provider("slow", iop_proto::config::Adapter::Ollama, "mock@first_token_delay_ms=60000", "slow", "");
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![slow], ..Default::default() }).await;
    let base = stack.url("");
    run_script("usage_truth.py", &["give-up", base.trim_end_matches('/'), &key, "slow"]).await;

    wait_until("the prompt charged", WAIT, || async {
        totals(&stack, "impatient").await["input_tokens"].as_u64() == Some(story_estimate())
    })
    .await;
    let impatient = totals(&stack, "impatient").await;
    assert_eq!(
        (impatient["output_tokens"].as_u64(), impatient["requests"].as_u64()),
        (Some(0), Some(1)),
        "{impatient}"
    );
    assert_eq!(impatient["input_tokens_unreported"], story_estimate());
}

/// A tunnelled Chat Completions stream that asks for no usage is charged
/// the provider's own count (the Edge asked for it on the client's
/// behalf), and the client sees no usage chunk.
#[tokio::test]
async fn a_tunnel_stream_without_include_usage_is_charged_and_sees_no_usage() {
    let (key, keys) = keys_with("quiet", "tokens_per_minute: 100000");
    let mut tunnel = provider("tunnel-mock", iop_proto::config::Adapter::Openai, "mock", "mock-tunnel", "");
    tunnel.mode = iop_proto::config::ProviderMode::Tunnel;
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![tunnel], ..Default::default() }).await;
    let base = stack.url("");
    let printed =
        run_script("usage_truth.py", &["quiet-stream", base.trim_end_matches('/'), &key, "mock-tunnel"]).await;
    let deltas: u64 = printed.trim().parse().unwrap();
    assert!(deltas > 0, "{printed}");
    let asked = stack.last_provider_request("/v1/chat/completions").await;
    assert_eq!(asked["stream_options"]["include_usage"], true, "{asked}");
    wait_until("the tunnel's tokens charged", WAIT, || async {
        totals(&stack, "quiet").await["output_tokens"].as_u64().is_some_and(|n| n > 0)
    })
    .await;
    let quiet = totals(&stack, "quiet").await;
    assert_eq!(
        (quiet["output_tokens_unreported"].as_u64(), quiet["input_tokens_unreported"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(quiet["input_tokens"].as_u64().unwrap() > 0, "{quiet}");
    let provider =
        "iop_edge_tokens_total{principal=\"quiet\",model=\"mock-tunnel\",kind=\"output\",source=\"provider\"}";
    assert_eq!(stack.metric(provider).await, quiet["output_tokens"].as_f64().unwrap());
}

/// Twenty answers at once under 1,000 tokens a minute, each reserving
/// its estimate and `max_tokens` (100): the bucket takes them while it has
/// room, one reservation past full at most; the rest are refused before
/// any provider works on them.
#[tokio::test]
async fn parallel_answers_are_refused_beyond_the_reserve() {
    let (key, keys) = keys_with("parallel", "tokens_per_minute: 1000");
    // Every answer still in flight when the last request arrives.
    let slow = provider("held", iop_proto::config::Adapter::Openai, "mock@headers_delay_ms=1500", "held", "");
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![slow], ..Default::default() }).await;
    let base = stack.url("");
    let printed = run_script("usage_truth.py", &["parallel", base.trim_end_matches('/'), &key, "held", "20"]).await;
    let outcome: Value = serde_json::from_str(printed.lines().last().unwrap()).unwrap();
    let reserve = story_estimate() + 100;
    let room = 1000_u64.div_ceil(reserve);
    assert_eq!(outcome["ok"].as_u64().unwrap() + outcome["rate_limited"].as_u64().unwrap(), 20, "{outcome}");
    assert!(outcome["ok"].as_u64().unwrap() <= room, "at most {room} reservations fit: {outcome}");
    assert!(outcome["ok"].as_u64().unwrap() >= 1, "{outcome}");
}

/// A hostile node (a modified binary with a real certificate) answers a
/// run with absurd usage: the client, the ledger and the key's limits see
/// the run's bound instead (its request's bytes and 1,024 for the prompt;
/// the bytes it relayed and 16 for the answer), the node's report is
/// counted, and the principal's next request is served.
#[tokio::test]
async fn a_hostile_nodes_usage_moves_the_bucket_only_by_its_bound() {
    let (key, keys) = keys_with("victim", "tokens_per_minute: 5000");
    let stack = Stack::start(StackOptions { keys: Some(keys), start_node: false, ..Default::default() }).await;
    let mut fake = FakeNode::register(&stack).await;
    fake.ready().await;

    let ask = |text: &'static str| {
        let (client, url, key) = (stack.client.clone(), stack.url("/v1/chat/completions"), key.clone());
        tokio::spawn(async move {
            let body = chat_body("mock-openai", text, false).to_string();
            let response =
                client.post(url).bearer_auth(key).header("content-type", "application/json").body(body).send().await;
            json_body(response.unwrap()).await
        })
    };
    let absurd = pb::Usage::provider(u32::MAX, u32::MAX, u32::MAX);
    let first = ask("hi");
    answer(&mut fake, "lots of text", absurd).await;
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(completion, "lots of text".len() as u64 + 16, "{body}");
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert!((1024..4096).contains(&prompt), "the request's bytes and 1,024: {body}");
    assert_eq!(stack.metric("iop_edge_node_usage_rejected_total{node=\"mac-1\"}").await, 1.0);
    wait_until("the bounded usage charged", WAIT, || async {
        totals(&stack, "victim").await["output_tokens"].as_u64() == Some(completion)
    })
    .await;
    assert_eq!(totals(&stack, "victim").await["input_tokens"].as_u64(), Some(prompt));

    // Not locked out: the next request is admitted and answered.
    let second = ask("again");
    answer(&mut fake, "fine", pb::Usage::provider(3, 1, 0)).await;
    let (status, body) = second.await.unwrap();
    assert_eq!((status, body["usage"]["total_tokens"].as_u64()), (200, Some(4)), "{body}");
}

/// The fake node's answer to its next run: `text`, then `usage`, completed.
async fn answer(fake: &mut FakeNode, text: &str, usage: pb::Usage) {
    let run = fake.next_run_answering_heartbeats().await;
    let (tx, rx) = mpsc::channel(8);
    let open = pb::RunOpen { run_id: run.run_id.clone(), generation: fake.generation };
    tx.send(pb::RunUplink { frame: Some(Frame::Open(open)) }).await.unwrap();
    let events = [
        run_event::Event::Started(pb::RunStarted { model: "mock".into(), ..Default::default() }),
        run_event::Event::Text(pb::TextDelta { text: text.into() }),
        run_event::Event::Usage(usage),
        run_event::Event::Completed(pb::RunCompleted { finish_reason: pb::FinishReason::Stop.into() }),
    ];
    for (seq, e) in events.into_iter().enumerate() {
        tx.send(event(seq as u64 + 1, e)).await.unwrap();
    }
    let mut client = fake.client.clone();
    let mut downlink = client.run_events(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tokio::spawn(async move {
        while let Ok(Some(_)) = downlink.message().await {}
        drop(tx);
    });
}
