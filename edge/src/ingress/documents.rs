//! Documents in client requests, one way for Messages (`document` blocks, in
//! user turns and tool results) and Responses (`input_file`): a local model
//! reads text, so a PDF becomes its text layer and a text document its text,
//! labelled with its name and kind so the model knows what it reads.
//!
//! Bounded like images: decoded size, documents per request, pages read,
//! bytes inflated and characters kept. A document that cannot be read (encrypted, no text
//! layer, malformed, wrong type, bad base64) is a `400` naming the block,
//! never something a provider is asked (and retried) about. The text never
//! reaches a log or a metric: errors name the block, not its contents.
//!
//! PDFs are read with `lopdf` (without its default features): one parser
//! crate over flate2/nom, with a bound on every stream it inflates (a small
//! file cannot decompress to gigabytes), RustCrypto for PDFs whose user
//! password is empty, and no TLS. `pdf-extract` lays text out better but
//! wraps an older `lopdf` plus a font stack.

use std::panic::{AssertUnwindSafe, catch_unwind};

use base64::Engine as _;
use std::collections::BTreeMap;

use lopdf::content::Content;
use lopdf::{Document, Encoding, LoadOptions, Object};

use serde_json::{Map, Value};

use super::error::ApiError;

/// Largest document accepted (decoded), Anthropic's own request bound; the
/// Edge's body limit (`limits.max_body_bytes`) is usually lower.
pub const MAX_DOCUMENT_BYTES: usize = 32 * 1024 * 1024;
/// Documents read in one request.
pub const MAX_DOCUMENTS: usize = 20;
/// Pages of a PDF read; the rest are named in the label, not read.
pub const MAX_PAGES: usize = 100;
/// Characters kept of one document's text; the label says when it was cut.
pub const MAX_CHARS: usize = 200_000;
/// Largest a PDF stream (object, cross-reference or page content) may
/// inflate to.
const MAX_INFLATED_BYTES: usize = 16 * 1024 * 1024;
/// What all page contents of one PDF may inflate to together: far above a
/// text layer's (a page of text is a few KiB), and it bounds the time one
/// PDF takes (measured: 15 MiB of page content read in ~90 ms, release).
const MAX_PAGE_CONTENT_BYTES: usize = 8 * 1024 * 1024;
/// What of them lopdf parses, all pages together: their text operations
/// (a few bytes a character shown, so well above [`MAX_CHARS`]' worth).
const MAX_TEXT_OPERATION_BYTES: usize = 1024 * 1024;

/// Why a document cannot be read; the message follows the block's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error("document type `{0}` is not supported (application/pdf, or text/* as UTF-8)")]
    MediaType(String),
    #[error("document is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    #[error("more than {MAX_DOCUMENTS} documents in one request")]
    TooMany,
    #[error("document data is not valid base64")]
    Base64,
    #[error("text document is not valid UTF-8")]
    NotUtf8,
    #[error("PDF is encrypted; send it unencrypted or as text")]
    Encrypted,
    #[error("PDF cannot be read (malformed or truncated)")]
    Malformed,
    #[error("PDF has no text layer (a scan?); send its pages as images or its text")]
    NoText,
    #[error("document source `{0}` is not supported; send the document inline (base64 or text)")]
    Source(String),
}

impl DocumentError {
    /// The `400` naming the block at `path`.
    pub fn at(self, path: &str) -> ApiError {
        ApiError::invalid_param(path, format!("{path}: {self}"))
    }
}

/// What a document is, by its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pdf,
    Text,
}

impl Kind {
    fn of(media_type: &str) -> Result<Self, DocumentError> {
        let essence = media_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match essence.as_str() {
            "application/pdf" => Ok(Self::Pdf),
            t if t.starts_with("text/") => Ok(Self::Text),
            "application/json" | "application/xml" | "application/yaml" | "application/x-yaml" => Ok(Self::Text),
            _ => Err(DocumentError::MediaType(media_type.to_string())),
        }
    }
}

/// The part types that carry a document in each API's content: Messages
/// `document`, Responses `input_file`, Chat `file`.
const DOCUMENT_TYPES: [&str; 3] = ["document", "input_file", "file"];

/// Refuses a request with more than [`MAX_DOCUMENTS`] documents before any
/// is read: document parts in `content` (or tool `output`) arrays anywhere
/// under `body[path]` (`messages`, `input`) are counted.
pub fn within_bound(body: &Map<String, Value>, path: &str) -> Result<(), ApiError> {
    fn count(value: &Value, in_content: bool) -> usize {
        match value {
            Value::Array(items) => items.iter().map(|v| count(v, in_content)).sum(),
            Value::Object(obj) => {
                let ty = obj.get("type").and_then(Value::as_str);
                let own = in_content && ty.is_some_and(|t| DOCUMENT_TYPES.contains(&t));
                let nested: usize =
                    ["content", "output"].iter().filter_map(|k| obj.get(*k)).map(|v| count(v, v.is_array())).sum();
                usize::from(own) + nested
            }
            _ => 0,
        }
    }
    match body.get(path) {
        Some(items) if count(items, false) > MAX_DOCUMENTS => Err(DocumentError::TooMany.at(path)),
        _ => Ok(()),
    }
}

/// A document given as base64 with its media type (Messages `base64`
/// sources), `name` its title or file name.
pub fn from_base64(media_type: &str, data: &str, name: Option<&str>, path: &str) -> Result<String, ApiError> {
    read_base64(media_type, data, name).map_err(|e| e.at(path))
}

/// A document given as a `data:` URL (Responses' and Chat's `file_data`).
pub fn from_data_url(url: &str, name: Option<&str>, path: &str) -> Result<String, ApiError> {
    let Some((media_type, data)) = url.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,")) else {
        return Err(ApiError::invalid_param(path, format!("{path}: must be a base64 `data:` URL")));
    };
    from_base64(media_type, data, name, path)
}

/// A document given as text (Messages `text` and `content` sources).
pub fn from_text(text: &str, name: Option<&str>, path: &str) -> Result<String, ApiError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::TooLarge.at(path));
    }
    Ok(label(name, "text", None, text))
}

fn read_base64(media_type: &str, data: &str, name: Option<&str>) -> Result<String, DocumentError> {
    let kind = Kind::of(media_type)?;
    if data.len() / 4 * 3 > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::TooLarge);
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(data.trim()).map_err(|_| DocumentError::Base64)?;
    match kind {
        Kind::Text => {
            let text = std::str::from_utf8(&bytes).map_err(|_| DocumentError::NotUtf8)?;
            Ok(label(name, "text", None, text))
        }
        Kind::Pdf => {
            let pdf = pdf_text(&bytes)?;
            Ok(label(name, "PDF", Some((pdf.read, pdf.pages)), &pdf.text))
        }
    }
}

/// Appends the text `kept` (a page's [`text_operations`]) shows, as lopdf's
/// `extract_text` reads it: `Tf` picks the font's encoding, `Tj`/`TJ`/`'`/`"`
/// show strings (a `TJ` gap wider than 100 units is a space), `T*`, `'`,
/// `"` and `ET` end a line.
fn page_text(doc: &Document, page: lopdf::ObjectId, kept: &[u8], text: &mut String) {
    let Ok(fonts) = doc.get_page_fonts(page) else { return };
    let encodings: BTreeMap<Vec<u8>, Encoding> = fonts
        .into_iter()
        .filter_map(|(name, font)| Some((name, font.get_font_encoding_with_limit(doc, MAX_INFLATED_BYTES).ok()?)))
        .collect();
    let Ok(content) = Content::decode(kept) else { return };
    fn show(text: &mut String, encoding: &Encoding, operands: &[Object]) {
        for operand in operands {
            match operand {
                Object::String(bytes, _) => {
                    let _ = encoding.write_to_string(bytes, text);
                }
                Object::Array(items) => show(text, encoding, items),
                Object::Integer(gap) if *gap < -100 => text.push(' '),
                Object::Real(gap) if *gap < -100.0 => text.push(' '),
                _ => {}
            }
        }
    }
    let new_line = |text: &mut String| {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
    };
    let mut encoding = None;
    for op in &content.operations {
        match op.operator.as_str() {
            "Tf" => encoding = op.operands.first().and_then(|f| f.as_name().ok()).and_then(|f| encodings.get(f)),
            "Tj" | "TJ" => encoding.into_iter().for_each(|e| show(text, e, &op.operands)),
            "'" | "\"" => {
                new_line(text);
                let shown = if op.operator == "'" { op.operands.first() } else { op.operands.get(2) };
                encoding.into_iter().for_each(|e| show(text, e, shown.map(std::slice::from_ref).unwrap_or_default()));
            }
            "T*" | "ET" => new_line(text),
            _ => {}
        }
    }
    new_line(text);
}

/// The operations of a content stream that show text or pick its font
/// (`Tf`, `Tj`, `TJ`, `'`, `"`, `T*`, `ET`), with their operands, one a
/// line; drawing, images and the rest are dropped. A byte scan: lopdf's
/// operator parser takes ~0.4 s per MiB of tiny drawing operators (a vector
/// chart, or a hostile page), so it sees only what can be text. At most
/// `limit` bytes are kept, whole operations; the flag says whether all were.
fn text_operations(content: &[u8], limit: usize) -> (Vec<u8>, bool) {
    const KEPT: [&[u8]; 7] = [b"Tf", b"Tj", b"TJ", b"'", b"\"", b"T*", b"ET"];
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' | 0);
    let is_delimiter = |b: u8| matches!(b, b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'{' | b'}' | b'/' | b'%');
    let mut out = Vec::new();
    let (mut i, mut operands) = (0, 0);
    while i < content.len() {
        match content[i] {
            b if is_space(b) => i += 1,
            b'%' => {
                while i < content.len() && !matches!(content[i], b'\n' | b'\r') {
                    i += 1;
                }
            }
            b'(' => {
                let mut depth = 0usize;
                while i < content.len() {
                    match content[i] {
                        b'\\' => i += 1,
                        b'(' => depth += 1,
                        b')' => depth -= 1,
                        _ => {}
                    }
                    i += 1;
                    if depth == 0 {
                        break;
                    }
                }
            }
            b'<' if content.get(i + 1) != Some(&b'<') => {
                while i < content.len() && content[i] != b'>' {
                    i += 1;
                }
                i += 1;
            }
            b'<' | b'>' => i += if content.get(i + 1) == Some(&content[i]) { 2 } else { 1 },
            b'[' | b']' | b'{' | b'}' | b')' => i += 1,
            _ => {
                // A name, number or operator.
                let start = i;
                i += 1;
                while i < content.len() && !is_space(content[i]) && !is_delimiter(content[i]) {
                    i += 1;
                }
                let token = &content[start..i];
                let operand = token[0] == b'/'
                    || token.iter().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+'))
                    || matches!(token, b"true" | b"false" | b"null");
                if operand {
                    continue;
                }
                if KEPT.contains(&token) {
                    if out.len() + (i - operands) + 1 > limit {
                        return (out, false);
                    }
                    out.extend_from_slice(&content[operands..i]);
                    out.push(b'\n');
                } else if token == b"ID" {
                    // Inline image data runs to `EI` between white space.
                    while i < content.len()
                        && !(is_space(content[i - 1])
                            && content[i..].starts_with(b"EI")
                            && content.get(i + 2).is_none_or(|b| is_space(*b)))
                    {
                        i += 1;
                    }
                    i += 2;
                }
                operands = i.min(content.len());
            }
        }
    }
    (out, true)
}

/// A PDF's text layer: the text of its first [`MAX_PAGES`] pages.
#[derive(Debug)]
struct PdfText {
    text: String,
    read: usize,
    pages: usize,
}

fn pdf_text(bytes: &[u8]) -> Result<PdfText, DocumentError> {
    // lopdf is a parser of hostile input: a panic in it is a malformed PDF,
    // not a dead request task.
    catch_unwind(AssertUnwindSafe(|| pdf_text_unguarded(bytes))).unwrap_or(Err(DocumentError::Malformed))
}

fn pdf_text_unguarded(bytes: &[u8]) -> Result<PdfText, DocumentError> {
    let options = LoadOptions { max_decompressed_size: Some(MAX_INFLATED_BYTES), ..LoadOptions::default() };
    let doc = Document::load_mem_with_options(bytes, options).map_err(|e| match e {
        lopdf::Error::Decryption(_) | lopdf::Error::InvalidPassword => DocumentError::Encrypted,
        _ => DocumentError::Malformed,
    })?;
    if doc.is_encrypted() {
        return Err(DocumentError::Encrypted);
    }
    let numbers: Vec<u32> = doc.get_pages().into_keys().collect();
    if numbers.is_empty() {
        return Err(DocumentError::Malformed);
    }
    let pages = doc.get_pages();
    let mut text = String::new();
    let mut read = 0;
    // What the page contents may inflate to, all pages together, and what
    // of them lopdf parses (their text operations). Past either, or past
    // what the character bound keeps, the rest is not read; the label says
    // so.
    let mut inflate_budget = MAX_PAGE_CONTENT_BYTES;
    let mut kept_budget = MAX_TEXT_OPERATION_BYTES;
    for &number in numbers.iter().take(MAX_PAGES) {
        if text.len() > MAX_CHARS * 4 {
            break;
        }
        let Ok(content) = doc.get_page_content_with_limit(pages[&number], inflate_budget) else {
            break;
        };
        inflate_budget -= content.len().min(inflate_budget);
        let (kept, whole) = text_operations(&content, kept_budget);
        kept_budget -= kept.len();
        read += 1;
        // A page whose text cannot be decoded (an odd font) is skipped; the
        // document as a whole fails only if no page has text.
        page_text(&doc, pages[&number], &kept, &mut text);
        if !whole {
            break;
        }
    }
    if text.trim().is_empty() {
        return Err(DocumentError::NoText);
    }
    Ok(PdfText { text, read, pages: numbers.len() })
}

/// The text a model reads: a header naming the document, its text (cut at
/// [`MAX_CHARS`], saying so) and a closing line.
fn label(name: Option<&str>, kind: &str, pages: Option<(usize, usize)>, text: &str) -> String {
    let name = name.map(str::trim).filter(|n| !n.is_empty()).map(|n| n.replace('"', "'").replace(['\n', '\r'], " "));
    let mut header = match &name {
        Some(name) => format!("<document name=\"{name}\" type=\"{kind}\""),
        None => format!("<document type=\"{kind}\""),
    };
    let mut notes = Vec::new();
    if let Some((read, pages)) = pages {
        header.push_str(&format!(" pages=\"{pages}\""));
        if read < pages {
            notes.push(format!("only the first {read} of {pages} pages were read"));
        }
    }
    let text = text.trim_matches('\n');
    let kept = match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => {
            notes.push(format!("the text was cut after {MAX_CHARS} characters"));
            &text[..cut]
        }
        None => text,
    };
    header.push('>');
    let mut out = format!("{header}\n{kept}\n");
    for note in notes {
        out.push_str(&format!("[{note}]\n"));
    }
    out.push_str("</document>");
    out
}

#[cfg(test)]
pub(crate) mod tests;
