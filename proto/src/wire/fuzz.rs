//! Property tests for what the Edge checks in a node's messages: closed
//! enums, `RunEvent::validate`, `ProviderTunnelFrame::validate` and
//! `evidence_pair`, over generated messages (any enum `i32`, missing parts)
//! and over arbitrary or damaged bytes decoded with prost. Nothing panics,
//! an unknown or zero enum is a typed error, and a frame that validates has
//! the part the Edge then takes out with `expect("validated")`.
//!
//! More cases: `PROPTEST_CASES=100000 cargo nextest run -p iop-proto fuzz`.

use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;

use super::*;

/// Mostly the known values and their neighbours, sometimes any `i32`.
fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![4 => -1..8i32, 1 => any::<i32>()]
}

/// What `closed_enum` must do with `value`, with prost's own `is_valid` as
/// the list of known values.
fn check_closed_enum<E>(value: i32, is_valid: fn(i32) -> bool) -> Result<(), TestCaseError>
where
    E: TryFrom<i32> + Into<i32> + Copy + std::fmt::Debug,
{
    match closed_enum::<E>("f", value) {
        Ok(e) => {
            prop_assert!(value != 0);
            prop_assert_eq!(e.into(), value);
        }
        Err(WireError::Unspecified { field: "f" }) => prop_assert_eq!(value, 0),
        Err(WireError::UnknownEnumValue { field: "f", value: v }) => {
            prop_assert_eq!(v, value);
            prop_assert!(!is_valid(value), "{value} is a known value");
        }
        Err(other) => prop_assert!(false, "unexpected {other:?}"),
    }
    Ok(())
}

/// A known, specified value of the enum whose values `is_valid` knows.
fn known(value: i32, is_valid: fn(i32) -> bool) -> bool {
    value != 0 && is_valid(value)
}

fn failure() -> impl Strategy<Value = Option<pb::ExecutionFailure>> {
    prop::option::of(
        (
            enum_value(),
            ".{0,8}",
            any::<u32>(),
            any::<u64>(),
            enum_value(),
            enum_value(),
            prop::option::of(any::<u64>()),
        )
            .prop_map(|(kind, message, provider_status, retry_after_ms, health, classification, seq)| {
                pb::ExecutionFailure {
                    kind,
                    message,
                    provider_status,
                    retry_after_ms,
                    provider_health: health,
                    liveness_classification: classification,
                    health_observation_seq: seq,
                    ..Default::default()
                }
            }),
    )
}

fn run_event() -> impl Strategy<Value = pb::RunEvent> {
    use pb::run_event::Event;
    let event = prop_oneof![
        ".{0,8}".prop_map(|model| Event::Started(pb::RunStarted { model, ..Default::default() })),
        ".{0,8}".prop_map(|text| Event::Text(pb::TextDelta { text })),
        (any::<u32>(), ".{0,4}", ".{0,4}", ".{0,8}").prop_map(|(index, id, name, arguments_delta)| {
            Event::ToolCall(pb::ToolCallDelta { index, id, name, arguments_delta })
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(p, c)| Event::Usage(pb::Usage {
            prompt_tokens: p,
            completion_tokens: c,
            ..Default::default()
        })),
        enum_value().prop_map(|finish_reason| Event::Completed(pb::RunCompleted { finish_reason })),
        failure().prop_map(|failure| Event::Failed(pb::RunFailed { failure })),
        enum_value().prop_map(|reason| Event::Cancelled(pb::RunCancelled { reason })),
    ];
    (any::<u64>(), prop::option::of(event)).prop_map(|(seq, event)| pb::RunEvent { seq, event })
}

fn tunnel_frame() -> impl Strategy<Value = pb::ProviderTunnelFrame> {
    use pb::provider_tunnel_frame::Frame;
    let status = prop_oneof![3 => 90..610u32, 1 => any::<u32>()];
    let header = (".{0,8}", ".{0,8}").prop_map(|(name, value)| pb::HttpHeader { name, value });
    let frame = prop_oneof![
        (status, prop::collection::vec(header, 0..3))
            .prop_map(|(status, headers)| Frame::Head(pb::TunnelResponseHead { status, headers })),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Frame::Body),
        Just(Frame::End(pb::TunnelEnd::default())),
        failure().prop_map(|failure| Frame::Failed(pb::RunFailed { failure })),
        enum_value().prop_map(|reason| Frame::Cancelled(pb::RunCancelled { reason })),
        (any::<u32>(), any::<u32>()).prop_map(|(p, c)| Frame::Usage(pb::Usage::provider(p, c, 0))),
    ];
    (any::<u64>(), prop::option::of(frame)).prop_map(|(seq, frame)| pb::ProviderTunnelFrame { seq, frame })
}

/// Whether `validate` must accept the event: it has one, and its enums are
/// known values (a failure must be there and carry a known kind).
fn run_event_is_valid(e: &pb::RunEvent) -> bool {
    use pb::run_event::Event;
    match &e.event {
        None => false,
        Some(Event::Completed(c)) => known(c.finish_reason, pb::FinishReason::is_valid),
        Some(Event::Failed(f)) => f.failure.as_ref().is_some_and(|f| known(f.kind, pb::FailureKind::is_valid)),
        Some(Event::Cancelled(c)) => known(c.reason, pb::CancelReason::is_valid),
        Some(
            Event::Started(_)
            | Event::Text(_)
            | Event::Reasoning(_)
            | Event::ToolCall(_)
            | Event::Usage(_)
            | Event::Embeddings(_),
        ) => true,
    }
}

fn tunnel_frame_is_valid(f: &pb::ProviderTunnelFrame) -> bool {
    use pb::provider_tunnel_frame::Frame;
    match &f.frame {
        None => false,
        Some(Frame::Head(h)) => (100..=599).contains(&h.status),
        Some(Frame::Failed(f)) => f.failure.as_ref().is_some_and(|f| known(f.kind, pb::FailureKind::is_valid)),
        Some(Frame::Cancelled(c)) => known(c.reason, pb::CancelReason::is_valid),
        Some(Frame::Body(_) | Frame::End(_) | Frame::Usage(_)) => true,
    }
}

/// Byte-level damage to an encoded message.
fn damage(mut bytes: Vec<u8>, edits: &[(Index, u8, u8)]) -> Vec<u8> {
    for (at, op, byte) in edits {
        if bytes.is_empty() {
            bytes.push(*byte);
            continue;
        }
        let i = at.index(bytes.len());
        match op % 4 {
            0 => bytes[i] = *byte,
            1 => bytes.insert(i, *byte),
            2 => {
                bytes.remove(i);
            }
            _ => bytes.truncate(i),
        }
    }
    bytes
}

/// Decodes `bytes` as each message a node sends and validates what decodes.
fn decode_and_validate(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(e) = pb::RunEvent::decode(bytes) {
        prop_assert_eq!(e.validate().is_ok(), run_event_is_valid(&e), "{:?}", e);
    }
    if let Ok(f) = pb::ProviderTunnelFrame::decode(bytes) {
        prop_assert_eq!(f.validate().is_ok(), tunnel_frame_is_valid(&f), "{:?}", f);
    }
    if let Ok(pb::RunUplink { frame: Some(pb::run_uplink::Frame::Event(e)) }) = pb::RunUplink::decode(bytes) {
        prop_assert_eq!(e.validate().is_ok(), run_event_is_valid(&e), "{:?}", e);
    }
    if let Ok(pb::TunnelUplink { msg: Some(pb::tunnel_uplink::Msg::Frame(f)) }) = pb::TunnelUplink::decode(bytes) {
        prop_assert_eq!(f.validate().is_ok(), tunnel_frame_is_valid(&f), "{:?}", f);
    }
    if let Ok(pb::NodeToEdge { msg: Some(pb::node_to_edge::Msg::HealthReport(report)) }) = pb::NodeToEdge::decode(bytes)
    {
        for s in &report.providers {
            check_closed_enum::<pb::ProviderHealth>(s.health, pb::ProviderHealth::is_valid)?;
        }
    }
    Ok(())
}

proptest! {
    /// Every wire enum: known non-zero values decode to themselves, zero is
    /// `Unspecified`, anything else is `UnknownEnumValue` with the value.
    #[test]
    fn fuzz_closed_enum_is_total_and_exact(value in enum_value()) {
        check_closed_enum::<pb::AdapterKind>(value, pb::AdapterKind::is_valid)?;
        check_closed_enum::<pb::ProviderHealth>(value, pb::ProviderHealth::is_valid)?;
        check_closed_enum::<pb::CancelReason>(value, pb::CancelReason::is_valid)?;
        check_closed_enum::<pb::CommandKind>(value, pb::CommandKind::is_valid)?;
        check_closed_enum::<pb::OllamaApiCall>(value, pb::OllamaApiCall::is_valid)?;
        check_closed_enum::<pb::CommandErrorCode>(value, pb::CommandErrorCode::is_valid)?;
        check_closed_enum::<pb::Role>(value, pb::Role::is_valid)?;
        check_closed_enum::<pb::FinishReason>(value, pb::FinishReason::is_valid)?;
        check_closed_enum::<pb::FailureKind>(value, pb::FailureKind::is_valid)?;
        check_closed_enum::<pb::LivenessClassification>(value, pb::LivenessClassification::is_valid)?;
        check_closed_enum::<pb::RecoveryHandoff>(value, pb::RecoveryHandoff::is_valid)?;
    }

    /// A run event validates exactly when it has an event whose enums are
    /// known (so the Edge's `expect("validated")` holds); the error otherwise
    /// names what is wrong.
    #[test]
    fn fuzz_run_event_validate(e in run_event()) {
        match e.validate() {
            Ok(()) => prop_assert!(run_event_is_valid(&e) && e.event.is_some(), "{e:?}"),
            Err(error) => {
                prop_assert!(!run_event_is_valid(&e), "{e:?}: {error}");
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }

    #[test]
    fn fuzz_tunnel_frame_validate(f in tunnel_frame()) {
        match f.validate() {
            Ok(()) => prop_assert!(tunnel_frame_is_valid(&f) && f.frame.is_some(), "{f:?}"),
            Err(error) => prop_assert!(!tunnel_frame_is_valid(&f), "{f:?}: {error}"),
        }
    }

    /// Any bytes, decoded as a node's message: no panic, and what decodes
    /// validates as its fields say.
    #[test]
    fn fuzz_decode_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        decode_and_validate(&bytes)?;
    }

    /// Encoded messages with damaged bytes: prost errors or decodes
    /// something that validates as its fields say.
    #[test]
    fn fuzz_decode_damaged_messages(
        e in run_event(),
        f in tunnel_frame(),
        edits in prop::collection::vec((any::<Index>(), any::<u8>(), any::<u8>()), 0..4),
    ) {
        let run = pb::RunUplink { frame: Some(pb::run_uplink::Frame::Event(e.clone())) };
        let tunnel = pb::TunnelUplink { msg: Some(pb::tunnel_uplink::Msg::Frame(f.clone())) };
        for bytes in [e.encode_to_vec(), f.encode_to_vec(), run.encode_to_vec(), tunnel.encode_to_vec()] {
            decode_and_validate(&damage(bytes, &edits))?;
        }
    }

    /// Stall evidence is one of the three allowed pairs, and an allowed pair
    /// is kept as sent.
    #[test]
    fn fuzz_evidence_pair_fails_closed(health in enum_value(), classification in enum_value()) {
        use pb::{LivenessClassification as C, ProviderHealth as H};
        let allowed = [(H::Available, C::RequestStalled), (H::Unavailable, C::ProviderUnhealthy), (H::Unknown, C::HealthUnknown)];
        let pair = evidence_pair(health, classification);
        prop_assert!(allowed.contains(&pair), "{pair:?}");
        if allowed[..2].iter().any(|(h, c)| i32::from(*h) == health && i32::from(*c) == classification) {
            prop_assert_eq!((i32::from(pair.0), i32::from(pair.1)), (health, classification));
        } else {
            prop_assert_eq!(pair, (H::Unknown, C::HealthUnknown));
        }
    }
}
