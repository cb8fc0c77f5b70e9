//! CAPABILITIES recovery: while the runtime overlay holds lowered providers,
//! ask their nodes for CAPABILITIES (periodically with backoff, and at once
//! when a node becomes ready) and recover a provider only from an exact,
//! current, strictly newer `available` answer; any other answer changes
//! nothing (`crate::overlay`'s rules). The node's own probe reports usually
//! get there first; this is the Edge's side of the same question.

use std::sync::Arc;
use std::time::Duration;

use iop_proto::pb;

use crate::core::health::Source;
use crate::node::health;
use crate::state::EdgeState;

const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(30);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(state: Arc<EdgeState>) {
    let mut delay = FIRST_DELAY;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = state.routing.recovery.notified() => delay = FIRST_DELAY,
        }
        let lowered = state.overlay.unavailable();
        if lowered.is_empty() {
            delay = FIRST_DELAY;
            continue;
        }
        let config = state.config.current();
        let mut nodes: Vec<&str> =
            config.providers.iter().filter(|p| lowered.contains(&p.id)).map(|p| p.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            probe_node(&state, node).await;
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

async fn probe_node(state: &EdgeState, node: &str) {
    let (Some(control), Some(generation)) = (state.registry.control_of(node), state.registry.current_generation(node))
    else {
        return;
    };
    let command = pb::NodeCommand { kind: pb::CommandKind::Capabilities.into(), ..Default::default() };
    let Ok(result) = state.link.commands.send(&control, command, COMMAND_TIMEOUT).await else { return };
    let Some(pb::node_command_result::Result::Capabilities(answer)) = result.result else { return };
    if health::apply_statuses(state, node, generation, Source::Capabilities, &answer.providers) {
        state.routing.admission.drain_queues();
    }
}
