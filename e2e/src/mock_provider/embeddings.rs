//! Embeddings and tokens (see *Embeddings* and *Tokenize* in the [`super`]
//! docs): what an embeddings request asks for in either API ([`EmbedPlan`]),
//! the mock's vectors and tokens, and the stable hashes they come from.

use serde::Deserialize;
use serde_json::Value;

use super::api::Api;

/// The length of the mock's embedding vectors.
pub const EMBEDDING_DIMENSIONS: usize = 8;
/// Token ids from [`tokenize`] are below this.
pub const TOKEN_VOCABULARY: u32 = 32_000;

#[derive(Debug, Deserialize)]
pub(super) struct EmbedRequest {
    pub(super) model: String,
    #[serde(default)]
    input: Value,
    /// OpenAI only: `"float"` (default) or `"base64"`.
    encoding_format: Option<Value>,
    /// OpenAI only: keep the first n floats (1..=8).
    dimensions: Option<Value>,
}

/// What to answer to an embeddings request, in either API.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct EmbedPlan {
    /// One vector per input, in order.
    pub(super) vectors: Vec<Vec<f32>>,
    /// Whitespace-separated words in all inputs.
    pub(super) prompt_tokens: u64,
    /// OpenAI `encoding_format: "base64"`.
    pub(super) base64: bool,
}

impl EmbedPlan {
    /// Checks the request; `Err` is the 400 message.
    pub(super) fn new(api: Api, req: &EmbedRequest) -> Result<Self, String> {
        let inputs: Vec<&str> = match &req.input {
            Value::String(text) => vec![text],
            Value::Array(items) if !items.is_empty() => items
                .iter()
                .map(Value::as_str)
                .collect::<Option<_>>()
                .ok_or("`input` must be a string or an array of strings")?,
            Value::Array(_) => return Err("`input` must not be an empty array".to_owned()),
            Value::Null => return Err("`input` is required: a string or an array of strings".to_owned()),
            _ => return Err("`input` must be a string or an array of strings".to_owned()),
        };
        let (base64, dimensions) = match api {
            Api::Ollama => (false, EMBEDDING_DIMENSIONS),
            Api::OpenAi | Api::Responses => {
                (encoding_is_base64(req.encoding_format.as_ref())?, dimensions(req.dimensions.as_ref())?)
            }
        };
        Ok(EmbedPlan {
            vectors: inputs.iter().map(|text| shortened_embedding(text, dimensions)).collect(),
            prompt_tokens: inputs.iter().map(|text| text.split_whitespace().count() as u64).sum(),
            base64,
        })
    }
}

fn encoding_is_base64(format: Option<&Value>) -> Result<bool, String> {
    let Some(format) = format else {
        return Ok(false);
    };
    match format.as_str() {
        Some("float") => Ok(false),
        Some("base64") => Ok(true),
        _ => Err(format!(r#"`encoding_format` must be "float" or "base64", not `{format}`"#)),
    }
}

fn dimensions(dimensions: Option<&Value>) -> Result<usize, String> {
    let Some(value) = dimensions else {
        return Ok(EMBEDDING_DIMENSIONS);
    };
    value
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=EMBEDDING_DIMENSIONS).contains(n))
        .ok_or_else(|| format!("`dimensions` must be an integer in 1..={EMBEDDING_DIMENSIONS}, not `{value}`"))
}

/// The mock's embedding of `text`: 8 floats from a hash of the text, scaled
/// to unit length. Equal texts give equal vectors, different texts (in
/// practice) different ones.
#[must_use]
pub fn embedding(text: &str) -> [f32; EMBEDDING_DIMENSIONS] {
    let mut state = fnv1a(text.as_bytes());
    let mut vector = [0f32; EMBEDDING_DIMENSIONS];
    for x in &mut vector {
        // 24 bits (exact in an f32) spread over [-1, 1).
        *x = (splitmix64(&mut state) >> 40) as f32 / (1 << 23) as f32 - 1.0;
    }
    to_unit_length(&mut vector);
    vector
}

/// The first `dimensions` floats of [`embedding`], scaled to unit length
/// (all of them: [`embedding`] itself).
pub(super) fn shortened_embedding(text: &str, dimensions: usize) -> Vec<f32> {
    let mut vector = embedding(text)[..dimensions].to_vec();
    if dimensions < EMBEDDING_DIMENSIONS {
        to_unit_length(&mut vector);
    }
    vector
}

fn to_unit_length(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The mock's tokens of `text`: one per whitespace-separated word, a hash of
/// the word below [`TOKEN_VOCABULARY`] (equal words, equal tokens).
#[must_use]
pub fn tokenize(text: &str) -> Vec<u32> {
    text.split_whitespace().map(|word| (fnv1a(word.as_bytes()) % u64::from(TOKEN_VOCABULARY)) as u32).collect()
}

/// FNV-1a (64 bits): stable across releases, unlike std's hasher.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// SplitMix64: the next well-mixed value of the sequence at `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// OpenAI's `encoding_format: "base64"`: the floats' little-endian bytes in
/// standard base64 (with padding).
pub(super) fn base64_f32s(vector: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests;
