//! A managed credential's state, as admission, the overlay's effective
//! view, metrics and the admin API read it.

use iop_proto::admin;

/// A provider's managed credential as `/admin/v1/providers`, the metric
/// `iop_edge_provider_credential` and (through the operator) the Provider's
/// status show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialState {
    Ok,
    /// `disabled: true` in the config.
    Disabled,
    /// The file cannot be read or its value is not usable.
    Invalid,
    /// The provider answered 401/403 to this value; cleared by a run it
    /// accepts or by a new value.
    Rejected,
    /// The provider's node refused to open this value's leases (a revision
    /// older than one it has seen, say); cleared by a lease it opens or by a
    /// new revision.
    RefusedByNode,
}

impl CredentialState {
    /// Every state, in the order of the metric's state set.
    pub const ALL: [Self; 5] = [Self::Ok, Self::Disabled, Self::Invalid, Self::Rejected, Self::RefusedByNode];

    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Disabled => "disabled",
            Self::Invalid => "invalid",
            Self::Rejected => "rejected",
            Self::RefusedByNode => "refused_by_node",
        }
    }

    /// Whether runs may be sealed with it at all. A rejected or refused
    /// credential still may (as a last resort: the provider's, or node's,
    /// next answer is the only evidence that it works again); a disabled or
    /// invalid one never.
    pub fn leasable(self) -> bool {
        matches!(self, Self::Ok | Self::Rejected | Self::RefusedByNode)
    }

    /// Chosen only when no other provider of the route is eligible.
    pub fn last_resort(self) -> bool {
        matches!(self, Self::Rejected | Self::RefusedByNode)
    }
}

/// As `/admin/v1/providers` shows it.
impl From<CredentialState> for admin::CredentialState {
    fn from(state: CredentialState) -> Self {
        match state {
            CredentialState::Ok => Self::Ok,
            CredentialState::Disabled => Self::Disabled,
            CredentialState::Invalid => Self::Invalid,
            CredentialState::Rejected => Self::Rejected,
            CredentialState::RefusedByNode => Self::RefusedByNode,
        }
    }
}
