//! The providers the Edge assigned to this node: which API each speaks
//! ([`AdapterKind`]) and where, validated once per assignment
//! ([`ProviderTarget`]).

use iop_proto::pb;
use iop_proto::wire::closed_enum;

use super::error::AdapterError;

/// Ollama's native chat endpoint ([`super::ollama`]), under `base_url`.
const OLLAMA_CHAT_PATH: &str = "/api/chat";
/// The OpenAI-compatible chat endpoint ([`super::openai`]), under `base_url`.
const OPENAI_CHAT_PATH: &str = "/v1/chat/completions";

/// Which provider API an assignment speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdapterKind {
    Ollama,
    OpenAi,
}

impl AdapterKind {
    /// Decodes the wire enum; unspecified and unknown values are rejected.
    pub fn from_wire(value: i32) -> Result<Self, AdapterError> {
        match closed_enum::<pb::AdapterKind>("adapter", value) {
            Ok(pb::AdapterKind::Ollama) => Ok(Self::Ollama),
            Ok(pb::AdapterKind::Openai) => Ok(Self::OpenAi),
            Ok(pb::AdapterKind::Unspecified) => {
                Err(AdapterError::InvalidRequest("field `adapter` is unspecified".into()))
            }
            Err(e) => Err(AdapterError::InvalidRequest(e.to_string())),
        }
    }

    pub fn to_wire(self) -> pb::AdapterKind {
        match self {
            Self::Ollama => pb::AdapterKind::Ollama,
            Self::OpenAi => pb::AdapterKind::Openai,
        }
    }
}

/// Providers assigned by the Edge, by id. Assignments that fail validation
/// are kept as errors so readiness reports them unavailable.
pub type Providers = std::collections::HashMap<String, Result<ProviderTarget, String>>;

/// One provider the edge assigned to this node, validated from pb::ProviderAssignment.
#[derive(Debug, Clone)]
pub struct ProviderTarget {
    pub provider_id: String,
    pub adapter: AdapterKind,
    pub target_model: String,
    /// `http(s)://host[:port][/path]`, no trailing slash.
    pub base_url: String,
    /// The adapter's chat endpoint under `base_url`, parsed once per
    /// assignment rather than once per run.
    pub(super) chat_url: reqwest::Url,
    /// Set when the Edge manages the provider's credential: every execution
    /// needs a lease for this profile (`crate::lease`).
    pub credential_profile: Option<String>,
    /// The node owner allows fetching image URLs for this provider
    /// (`images.fetch_urls`; only an adapter that takes image data needs it).
    pub fetch_image_urls: bool,
    /// The Edge asked this provider's model to stay resident and the node's
    /// owner allows it (`models.allow_keep_warm`; Ollama only): runs carry
    /// Ollama's `keep_alive` and [`crate::keep_warm`] touches the model.
    pub keep_warm: bool,
}

impl ProviderTarget {
    /// Validates an assignment: known adapter, non-empty provider id and
    /// model, and an `http`/`https` base URL with a host and no credentials,
    /// query or fragment.
    pub fn from_assignment(a: &pb::ProviderAssignment) -> Result<Self, AdapterError> {
        let invalid =
            |what: String| AdapterError::InvalidRequest(format!("provider assignment `{}`: {what}", a.provider_id));
        if a.provider_id.trim().is_empty() {
            return Err(AdapterError::InvalidRequest("provider assignment has an empty provider_id".into()));
        }
        let adapter = AdapterKind::from_wire(a.adapter).map_err(|e| invalid(e.detail()))?;
        if a.target_model.trim().is_empty() {
            return Err(invalid("target_model is empty".into()));
        }
        let base_url = validate_base_url(&a.base_url).map_err(invalid)?;
        let mut target = Self::new(&a.provider_id, adapter, &a.target_model, &base_url).map_err(invalid)?;
        target.credential_profile = Some(a.credential_profile.clone()).filter(|p| !p.is_empty());
        Ok(target)
    }

    /// A target on an already validated `base_url`.
    pub(crate) fn new(
        provider_id: &str,
        adapter: AdapterKind,
        target_model: &str,
        base_url: &str,
    ) -> Result<Self, String> {
        let path = match adapter {
            AdapterKind::Ollama => OLLAMA_CHAT_PATH,
            AdapterKind::OpenAi => OPENAI_CHAT_PATH,
        };
        let chat_url = reqwest::Url::parse(&format!("{base_url}{path}"))
            .map_err(|e| format!("base_url `{base_url}` is not a valid URL: {e}"))?;
        Ok(Self {
            provider_id: provider_id.to_owned(),
            adapter,
            target_model: target_model.to_owned(),
            base_url: base_url.to_owned(),
            chat_url,
            credential_profile: None,
            fetch_image_urls: false,
            keep_warm: false,
        })
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }
}

fn validate_base_url(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim().trim_end_matches('/');
    let url = reqwest::Url::parse(trimmed).map_err(|e| format!("base_url `{raw}` is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("base_url `{raw}` must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("base_url `{raw}` has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("base_url must not carry credentials".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("base_url `{raw}` must not have a query or fragment"));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests;
