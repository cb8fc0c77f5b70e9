//! Strict JSON walking shared by the three request parsers (`openai_chat`,
//! `openai_responses`, `anthropic_messages`).
//!
//! Every helper that can fail returns [`ApiError::InvalidRequest`] with
//! `param` set to the field path it was given and a message that names that
//! path in the API's own [`Wording`]. An explicit `null` counts as absent.

use iop_proto::pb;
use serde_json::{Map, Value};

use super::error::ApiError;

/// The request body as a JSON object (the top level of every request).
pub(super) fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("invalid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid("request body must be a JSON object"));
    };
    Ok(obj)
}

/// The field, with an explicit `null` treated as absent.
pub(super) fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A normalized message with text content only.
pub(super) fn text_message(role: pb::Role, content: String) -> pb::ChatMessage {
    pb::ChatMessage { role: role.into(), content, ..Default::default() }
}

/// How an API words a validation message about the field at `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wording {
    /// OpenAI: "`messages[0].role` is required", "`stream` must be a boolean".
    OpenAi,
    /// Anthropic (pydantic style, path first): "messages.0.role: Field
    /// required", "stream: Input should be a boolean".
    Anthropic,
}

impl Wording {
    /// `path` is absent (or `null`).
    pub(super) fn missing(self, path: &str) -> ApiError {
        let message = match self {
            Self::OpenAi => format!("`{path}` is required"),
            Self::Anthropic => format!("{path}: Field required"),
        };
        ApiError::invalid_param(path, message)
    }

    /// `path` is not `expected` (e.g. "a string", "an integer between 1 and 10").
    pub(super) fn type_error(self, path: &str, expected: &str) -> ApiError {
        let message = match self {
            Self::OpenAi => format!("`{path}` must be {expected}"),
            Self::Anthropic => format!("{path}: Input should be {expected}"),
        };
        ApiError::invalid_param(path, message)
    }

    /// `obj[key]`, which must be present; `path` names it in errors.
    pub(super) fn required<'a>(
        self,
        obj: &'a Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<&'a Value, ApiError> {
        field(obj, key).ok_or_else(|| self.missing(path))
    }

    pub(super) fn string<'a>(self, value: &'a Value, path: &str) -> Result<&'a str, ApiError> {
        value.as_str().ok_or_else(|| self.type_error(path, "a string"))
    }

    /// `obj[key]`, which must be a non-empty string.
    pub(super) fn non_empty_string<'a>(
        self,
        obj: &'a Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<&'a str, ApiError> {
        let s = self.string(self.required(obj, key, path)?, path)?;
        if s.is_empty() {
            let message = match self {
                Self::OpenAi => format!("`{path}` must not be empty"),
                Self::Anthropic => format!("{path}: must not be empty"),
            };
            return Err(ApiError::invalid_param(path, message));
        }
        Ok(s)
    }

    pub(super) fn optional_bool(
        self,
        obj: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<bool>, ApiError> {
        field(obj, key).map(|v| v.as_bool().ok_or_else(|| self.type_error(path, "a boolean"))).transpose()
    }

    /// The items of the array `obj[key]` (none if absent), each parsed by
    /// `parse` with its path `item_path(i)`; `key` is also the array's path.
    pub(super) fn optional_array<T>(
        self,
        obj: &Map<String, Value>,
        key: &str,
        item_path: impl Fn(usize) -> String,
        parse: impl Fn(&Value, &str) -> Result<T, ApiError>,
    ) -> Result<Vec<T>, ApiError> {
        match field(obj, key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().enumerate().map(|(i, v)| parse(v, &item_path(i))).collect(),
            Some(_) => Err(self.type_error(key, "an array")),
        }
    }

    /// An integer in `1..=u32::MAX`.
    pub(super) fn positive_u32(self, value: &Value, path: &str) -> Result<u32, ApiError> {
        if !value.is_number() {
            return Err(self.type_error(path, "an integer"));
        }
        value
            .as_u64()
            .filter(|n| *n >= 1)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.type_error(path, &format!("an integer between 1 and {}", u32::MAX)))
    }

    /// A number in `min..=max`.
    pub(super) fn number_in(self, value: &Value, path: &str, min: f64, max: f64) -> Result<f32, ApiError> {
        let n = value.as_f64().ok_or_else(|| self.type_error(path, "a number"))?;
        if !(min..=max).contains(&n) {
            return Err(self.type_error(path, &format!("between {min} and {max}")));
        }
        Ok(n as f32)
    }
}
