//! `meta/v1` Conditions. `lastTransitionTime` moves only when a condition's
//! status flips; reason, message and observed generation may change without
//! moving it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";

/// `True`, `False` or `Unknown`, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// The condition of `type_` to write now, given the object's current ones.
pub fn next(
    current: &[Condition],
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let last_transition_time = current
        .iter()
        .find(|c| c.type_ == type_ && c.status == status.as_str())
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let first = next(&[], READY, Status::False, "NodeNotFound", "a", Some(1), at(100));
        assert_eq!(first.last_transition_time, Time(at(100)));

        // Same status, new reason, message and generation: time stays.
        let same = next(std::slice::from_ref(&first), READY, Status::False, "InvalidSpec", "b", Some(2), at(200));
        assert_eq!(same.last_transition_time, Time(at(100)));
        assert_eq!(
            (same.reason.as_str(), same.message.as_str(), same.observed_generation),
            ("InvalidSpec", "b", Some(2))
        );

        // Flip: time moves.
        let flipped = next(&[same], READY, Status::True, "Accepted", "ok", Some(2), at(300));
        assert_eq!(flipped.last_transition_time, Time(at(300)));
        assert_eq!(flipped.status, "True");
    }

    #[test]
    fn other_condition_types_do_not_count() {
        let other = next(&[], "Connected", Status::True, "Connected", "", None, at(100));
        let ready = next(&[other], READY, Status::True, "Accepted", "", None, at(200));
        assert_eq!(ready.last_transition_time, Time(at(200)));
    }
}
