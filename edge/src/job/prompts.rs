//! What the model is told: one system message for the whole job, and one
//! instruction at the start of each stage (a `WorkspaceTemplate` may replace
//! any of them).

use iop_proto::config::StagePrompts;

use super::state::Stage;

pub const SYSTEM: &str = "You are carrying out the user's request inside a software workspace on their machine. \
You can only touch it through the workspace_* tools you are given; paths are relative to the workspace root. \
Work in the stages you are asked for, one tool call at a time, and keep your answers short.";

const PLAN: &str = "Stage: planning. Look at the workspace with workspace_list and workspace_read as needed, \
then answer with a short numbered plan for the user's request. Do not change anything yet.";

const WORK: &str = "Stage: working. Carry out the plan with the tools you have. When the work is done, answer \
with a short summary of what you changed.";

const REVIEW: &str = "Stage: reviewing. Check the work against the user's request, reading files as needed. \
Answer with JSON only, exactly {\"verdict\":\"approve\",\"notes\":\"...\"} if it is done and correct, or \
{\"verdict\":\"repair\",\"notes\":\"what to fix\"} if it is not.";

const REPAIR: &str = "Stage: repairing. The review asked for a repair. Read what you need and answer with a \
short plan for the fix; you will carry it out next.";

const FINALIZE: &str = "Stage: finalizing. Write the final answer to the user's request: what was done and \
the result. No tool calls.";

/// The instruction that opens `stage`; a repair also gets the review's notes.
pub fn instruction(stage: Stage, overrides: &StagePrompts, notes: Option<&str>) -> String {
    let (custom, default) = match stage {
        Stage::Planning => (&overrides.plan, PLAN),
        Stage::Working => (&overrides.work, WORK),
        Stage::Reviewing => (&overrides.review, REVIEW),
        Stage::Repairing => (&overrides.repair, REPAIR),
        Stage::Finalizing => (&overrides.finalize, FINALIZE),
    };
    let text = custom.as_deref().unwrap_or(default);
    match (stage, notes) {
        (Stage::Repairing, Some(notes)) if !notes.is_empty() => format!("{text}\n\nReview notes: {notes}"),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
