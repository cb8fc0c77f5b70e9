//! Images in client requests, one way for all three APIs: a `data:` URL or
//! base64 with its media type is decoded and bounded; an http(s) URL is kept
//! for whoever fetches it. Anything else is a `400` naming the field.

use base64::Engine as _;
use iop_proto::pb;
use iop_proto::wire::{IMAGE_MEDIA_TYPES, MAX_IMAGE_BYTES};

use super::error::ApiError;

/// An image given by URL (OpenAI's `image_url`, Responses' `input_image`,
/// Anthropic's `{"type": "url"}` source).
pub(super) fn from_url(url: &str, path: &str) -> Result<pb::Image, ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest
            .split_once(";base64,")
            .ok_or_else(|| ApiError::invalid_param(path, format!("`{path}` must be a base64 `data:` URL")))?;
        return from_base64(media_type, data, path);
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(pb::Image { url: url.to_string(), ..Default::default() });
    }
    Err(ApiError::invalid_param(path, format!("`{path}` must be an http(s) URL or a base64 `data:` URL")))
}

/// An image given as base64 with its media type.
pub(super) fn from_base64(media_type: &str, data: &str, path: &str) -> Result<pb::Image, ApiError> {
    if !IMAGE_MEDIA_TYPES.contains(&media_type) {
        let message = format!("`{path}`: image type `{media_type}` is not supported (png, jpeg, gif or webp)");
        return Err(ApiError::invalid_param(path, message));
    }
    if data.len() / 4 * 3 > MAX_IMAGE_BYTES {
        return Err(ApiError::invalid_param(path, format!("`{path}` is larger than {MAX_IMAGE_BYTES} bytes")));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|_| ApiError::invalid_param(path, format!("`{path}` is not valid base64")))?;
    Ok(pb::Image { media_type: media_type.to_string(), data, url: String::new() })
}

#[cfg(test)]
mod tests;
