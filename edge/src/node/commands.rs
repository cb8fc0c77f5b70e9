//! Node commands (CAPABILITIES, TRANSPORT_STATUS) sent over a node's control
//! stream, with their results matched back by command id.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use iop_proto::pb;
use tokio::sync::oneshot;

use super::registry::ControlSender;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("node is not connected")]
    NotConnected,
    #[error("node did not answer within {0:?}")]
    Timeout(Duration),
    #[error("node connection closed before it answered")]
    ConnectionClosed,
}

#[derive(Default)]
pub struct CommandTable {
    pending: Mutex<HashMap<String, oneshot::Sender<pb::NodeCommandResult>>>,
}

impl CommandTable {
    /// Sends `command` (its id is assigned here) and waits for its result.
    pub async fn send(
        &self,
        control: &ControlSender,
        mut command: pb::NodeCommand,
        timeout: Duration,
    ) -> Result<pb::NodeCommandResult, CommandError> {
        let command_id = crate::ids::new_uuid().simple().to_string();
        command.command_id = command_id.clone();
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(command_id.clone(), tx);
        // Removes the entry however this future ends, including when its
        // caller goes away mid-wait (an admin client that disconnects).
        let _pending = Pending { table: self, command_id };
        let msg = pb::EdgeToNode { msg: Some(pb::edge_to_node::Msg::Command(command)) };
        match control.send(Ok(msg)).await {
            Err(_) => Err(CommandError::NotConnected),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Err(_) => Err(CommandError::Timeout(timeout)),
                Ok(Err(_)) => Err(CommandError::ConnectionClosed),
                Ok(Ok(result)) => Ok(result),
            },
        }
    }

    /// Commands waiting for their node's answer.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap().len()
    }

    /// Delivers a result to its waiter; results nobody waits for are dropped.
    pub fn complete(&self, result: pb::NodeCommandResult) -> bool {
        match self.pending.lock().unwrap().remove(&result.command_id) {
            Some(waiter) => waiter.send(result).is_ok(),
            None => false,
        }
    }
}

/// One waiter's entry in the table, removed when the waiter is done or gone.
struct Pending<'t> {
    table: &'t CommandTable,
    command_id: String,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.table.pending.lock().unwrap().remove(&self.command_id);
    }
}

#[cfg(test)]
mod tests;
