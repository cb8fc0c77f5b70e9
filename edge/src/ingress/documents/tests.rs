use base64::Engine as _;
use lopdf::content::{Content, Operation};
use lopdf::{Document, Object, Stream, dictionary};
use serde_json::json;

use super::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A valid PDF, written with lopdf, whose page `i` shows `pages[i]`
/// (Helvetica, so the text layer is plain WinAnsi text). `compress` deflates
/// the page content streams.
pub(crate) fn pdf(pages: &[&str]) -> Vec<u8> {
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica",
    });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let mut kids = Vec::new();
    for text in pages {
        let content = Content {
            operations: vec![
                Operation::new("BT", vec![]),
                Operation::new("Tf", vec!["F1".into(), 12.into()]),
                Operation::new("Td", vec![72.into(), 720.into()]),
                Operation::new("Tj", vec![Object::string_literal(*text)]),
                Operation::new("ET", vec![]),
            ],
        };
        let mut stream = Stream::new(dictionary! {}, content.encode().unwrap());
        stream.compress().unwrap();
        let content_id = doc.add_object(stream);
        kids.push(Object::from(doc.add_object(dictionary! {
            "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
        })));
    }
    let count = kids.len() as i64;
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => count, "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

fn read_pdf(bytes: &[u8]) -> Result<String, ApiError> {
    from_base64("application/pdf", &b64(bytes), Some("report.pdf"), "messages.0.content.1")
}

fn message(err: ApiError) -> (Option<String>, String) {
    match err {
        ApiError::InvalidRequest { message, param } => (param, message),
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn refused(result: Result<String, ApiError>, says: &str) {
    let (param, text) = message(result.expect_err("refused"));
    assert_eq!(param.as_deref(), Some("messages.0.content.1"));
    assert!(text.starts_with("messages.0.content.1: "), "{text}");
    assert!(text.contains(says), "{text}");
}

// ---------------------------------------------------------------- abuse

#[test]
fn hostile_documents_are_a_400_naming_the_block() {
    let path = "messages.0.content.1";
    // Wrong media types, bad base64, a declared size past the bound.
    refused(from_base64("image/png", "AAAA", None, path), "document type `image/png` is not supported");
    refused(from_base64("application/zip", "AAAA", None, path), "not supported");
    refused(from_base64("application/pdf", "%%% not base64 %%%", None, path), "not valid base64");
    let huge = "A".repeat(MAX_DOCUMENT_BYTES / 3 * 4 + 8);
    refused(from_base64("application/pdf", &huge, None, path), "larger than");
    refused(from_text(&"x".repeat(MAX_DOCUMENT_BYTES + 1), None, path), "larger than");
    // Text that is not UTF-8.
    refused(from_base64("text/plain", &b64(&[0xff, 0xfe, 0x00, 0xd8]), None, path), "not valid UTF-8");
    // Garbage, a truncated PDF, a PDF header with nothing behind it.
    refused(read_pdf(b"this is not a pdf at all"), "cannot be read");
    let good = pdf(&["Hello"]);
    refused(read_pdf(&good[..good.len() / 3]), "cannot be read");
    refused(read_pdf(b"%PDF-1.7\n%%EOF\n"), "cannot be read");
    // A PDF whose pages draw no text (a scan has images only).
    refused(read_pdf(&pdf(&[""])), "no text layer");
    // A data: URL that is not one.
    refused(from_data_url("https://example.com/a.pdf", None, path), "base64 `data:` URL");
}

#[test]
fn an_encrypted_pdf_is_refused() {
    // The trailer names an /Encrypt dictionary (standard handler, revision
    // 4, AES) with a user password that is not empty.
    let mut doc = Document::load_mem(&pdf(&["secret"])).unwrap();
    let encrypt = doc.add_object(dictionary! {
        "Filter" => "Standard", "V" => 4, "R" => 4, "Length" => 128,
        "O" => Object::string_literal(vec![1u8; 32]), "U" => Object::string_literal(vec![2u8; 32]),
        "P" => -4,
        "CF" => dictionary! { "StdCF" => dictionary! { "CFM" => "AESV2", "Length" => 16 } },
        "StmF" => "StdCF", "StrF" => "StdCF",
    });
    doc.trailer.set("Encrypt", encrypt);
    doc.trailer.set("ID", vec![Object::string_literal(vec![3u8; 16]), Object::string_literal(vec![3u8; 16])]);
    let mut bytes = Vec::new();
    doc.save_to(&mut bytes).unwrap();
    let err = read_pdf(&bytes).expect_err("refused");
    let (_, text) = message(err);
    assert!(text.contains("PDF is encrypted"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[test]
fn a_deflate_bomb_in_a_page_is_bounded() {
    // One page whose content stream inflates past the bound: the page is
    // skipped, and with no other text the PDF has no text layer.
    let mut doc = Document::load_mem(&pdf(&["x"])).unwrap();
    let page = *doc.get_pages().values().next().unwrap();
    let mut stream = Stream::new(dictionary! {}, vec![b' '; MAX_INFLATED_BYTES + 1024]);
    stream.compress().unwrap();
    let bomb = doc.add_object(stream);
    doc.get_object_mut(page).unwrap().as_dict_mut().unwrap().set("Contents", bomb);
    let mut bytes = Vec::new();
    doc.save_to(&mut bytes).unwrap();
    assert!(bytes.len() < 64 * 1024, "{}", bytes.len());
    let started = std::time::Instant::now();
    refused(read_pdf(&bytes), "no text layer");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn more_documents_than_the_bound_are_refused_before_any_is_read() {
    let doc = json!({"type": "document", "source": {"type": "text", "data": "t"}});
    let tool = |n: usize| json!({"type": "tool_result", "tool_use_id": "t", "content": vec![doc.clone(); n]});
    let body = |v: serde_json::Value| v.as_object().unwrap().clone();
    // Counted across messages, turns and tool results.
    let at_bound = json!({"messages": [
        {"role": "user", "content": vec![doc.clone(); MAX_DOCUMENTS - 5]},
        {"role": "user", "content": [tool(5)]},
    ]});
    within_bound(&body(at_bound), "messages").unwrap();
    let over = json!({"messages": [
        {"role": "user", "content": vec![doc.clone(); MAX_DOCUMENTS - 5]},
        {"role": "user", "content": [tool(6)]},
    ]});
    let (param, text) = message(within_bound(&body(over), "messages").unwrap_err());
    assert_eq!(param.as_deref(), Some("messages"));
    assert_eq!(text, format!("messages: more than {MAX_DOCUMENTS} documents in one request"));
    // Responses `input_file` parts and tool `output` arrays; Chat `file` parts.
    let file = json!({"type": "input_file", "file_data": "x"});
    let over = json!({"input": [
        {"role": "user", "content": vec![file.clone(); MAX_DOCUMENTS]},
        {"type": "function_call_output", "call_id": "c", "output": [file]},
    ]});
    assert!(within_bound(&body(over), "input").is_err());
    let over = json!({"messages": [{"role": "user", "content": vec![json!({"type": "file", "file": {}}); MAX_DOCUMENTS + 1]}]});
    assert!(within_bound(&body(over), "messages").is_err());
    // A tool's arguments are not content.
    let not_content = json!({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"items": vec![doc.clone(); MAX_DOCUMENTS + 1]}}
    ]}]});
    within_bound(&body(not_content), "messages").unwrap();
}

// ---------------------------------------------------------------- reading

#[test]
fn a_pdf_becomes_its_labelled_text_layer() {
    let text = read_pdf(&pdf(&["Quarterly revenue rose", "Second page here"])).unwrap();
    assert!(text.starts_with("<document name=\"report.pdf\" type=\"PDF\" pages=\"2\">\n"), "{text}");
    assert!(text.contains("Quarterly revenue rose"), "{text}");
    assert!(text.contains("Second page here"), "{text}");
    assert!(text.find("Quarterly").unwrap() < text.find("Second").unwrap());
    assert!(text.ends_with("\n</document>"), "{text}");

    // Through a data: URL (Responses' `file_data`), the same.
    let url = format!("data:application/pdf;base64,{}", b64(&pdf(&["Via data URL"])));
    let text = from_data_url(&url, Some("a.pdf"), "input.0.content.0").unwrap();
    assert!(text.contains("Via data URL"), "{text}");
}

#[test]
fn pages_past_the_bound_are_named_not_read() {
    let pages: Vec<String> = (1..=MAX_PAGES + 2).map(|i| format!("Page number {i}")).collect();
    let pages: Vec<&str> = pages.iter().map(String::as_str).collect();
    let bytes = pdf(&pages);
    let started = std::time::Instant::now();
    let text = read_pdf(&bytes).unwrap();
    eprintln!("{} pages, {} bytes: read in {:?}", pages.len(), bytes.len(), started.elapsed());
    assert!(text.contains(&format!("Page number {MAX_PAGES}\n")), "{text}");
    assert!(!text.contains(&format!("Page number {}", MAX_PAGES + 1)), "{text}");
    let note = format!("[only the first {MAX_PAGES} of {} pages were read]", MAX_PAGES + 2);
    assert!(text.contains(&note), "{text}");
}

#[test]
fn page_contents_past_the_documents_inflate_budget_are_not_read_and_the_label_says_so() {
    // Three pages, each ~3 MiB of content (a comment, quick to parse;
    // deflated to a few KiB) before its text: the third is past the 8 MiB
    // budget.
    let mut doc = Document::load_mem(&pdf(&["one", "two", "three"])).unwrap();
    for page in doc.get_pages().into_values().collect::<Vec<_>>() {
        let mut drawing = [b"%".repeat(3 * 1024 * 1024), b"\n".to_vec()].concat();
        let mut drawing = Stream::new(dictionary! {}, std::mem::take(&mut drawing));
        drawing.compress().unwrap();
        let drawing = doc.add_object(drawing);
        let page = doc.get_object_mut(page).unwrap().as_dict_mut().unwrap();
        let text = page.get(b"Contents").unwrap().clone();
        page.set("Contents", vec![drawing.into(), text]);
    }
    let mut bytes = Vec::new();
    doc.save_to(&mut bytes).unwrap();
    let text = read_pdf(&bytes).unwrap();
    assert!(text.contains("one") && text.contains("two") && !text.contains("three"), "{text}");
    assert!(text.contains("[only the first 2 of 3 pages were read]"), "{text}");
}

/// Only what can show text reaches lopdf's operator parser: strings that
/// look like operators, comments and inline image data stay what they are.
#[test]
fn text_operations_keep_what_shows_text_and_drop_the_rest() {
    let content = b"q 1 0 0 1 0 0 cm 0 0 m 10 10 l S % a comment with (Tj)\n\
        BI /W 1 /H 1 /BPC 8 /CS /G ID \x00EI(Tj)\xff EI Q\n\
        BT /F1 12 Tf 72 720 Td (a \\( (Tj) ET) Tj [(W) -120 (orld) <414243>] TJ T* (x) ' 1 2 (y) \" ET\n\
        << /MCID 0 >> BDC EMC";
    assert_eq!(
        String::from_utf8_lossy(&text_operations(content, usize::MAX).0),
        " /F1 12 Tf\n (a \\( (Tj) ET) Tj\n [(W) -120 (orld) <414243>] TJ\n T*\n (x) '\n 1 2 (y) \"\n ET\n"
    );
    // Cut at whole operations.
    let (kept, whole) = text_operations(content, 20);
    assert_eq!((String::from_utf8_lossy(&kept).as_ref(), whole), (" /F1 12 Tf\n", false));
}

/// A one-page PDF whose page draws 8 MiB of tiny operators (`q Q`) before
/// its `text`: lopdf's own content parser takes seconds on it.
fn drawing_then_text(text: &str) -> Vec<u8> {
    let mut doc = Document::load_mem(&pdf(&[text])).unwrap();
    let page = *doc.get_pages().values().next().unwrap();
    let mut drawing = Stream::new(dictionary! {}, b"q Q\n".repeat(MAX_PAGE_CONTENT_BYTES / 4 - 64));
    drawing.compress().unwrap();
    let drawing = doc.add_object(drawing);
    let dict = doc.get_object_mut(page).unwrap().as_dict_mut().unwrap();
    let contents = dict.get(b"Contents").unwrap().clone();
    dict.set("Contents", vec![drawing.into(), contents]);
    let mut bytes = Vec::new();
    doc.save_to(&mut bytes).unwrap();
    bytes
}

#[test]
fn a_page_of_drawing_is_read_quickly() {
    // A page of 8 MiB of tiny drawing operators (lopdf's parser alone takes
    // seconds on it) before its text.
    let bytes = drawing_then_text("caption");
    let started = std::time::Instant::now();
    assert!(read_pdf(&bytes).unwrap().contains("caption"));
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn text_documents_are_text_and_long_text_is_cut_saying_so() {
    let text = from_base64("text/plain; charset=utf-8", &b64("héllo\nworld".as_bytes()), None, "p").unwrap();
    assert_eq!(text, "<document type=\"text\">\nhéllo\nworld\n</document>");
    let text = from_text("notes", Some("a \"quoted\"\nname"), "p").unwrap();
    assert_eq!(text, "<document name=\"a 'quoted' name\" type=\"text\">\nnotes\n</document>");
    let long = "é".repeat(MAX_CHARS + 10);
    let text = from_text(&long, None, "p").unwrap();
    assert_eq!(text.matches('é').count(), MAX_CHARS);
    assert!(text.ends_with(&format!("[the text was cut after {MAX_CHARS} characters]\n</document>")), "{text}");
}

/// Extraction time at the bounds (not a check): `cargo nextest run -p
/// iop-edge --release measure_extraction_time --run-ignored only
/// --no-capture`.
#[test]
#[ignore]
fn measure_extraction_time() {
    let line = "The quick brown fox jumps over the lazy dog 0123456789. ";
    let page = line.repeat(60);
    for n in [100usize, 400] {
        let pages: Vec<&str> = (0..n).map(|_| page.as_str()).collect();
        let bytes = pdf(&pages);
        let started = std::time::Instant::now();
        let text = read_pdf(&bytes).unwrap();
        eprintln!(
            "{n} pages, {} bytes PDF: {} chars out in {:?}",
            bytes.len(),
            text.chars().count(),
            started.elapsed()
        );
    }
    let bytes = drawing_then_text("drawn");
    let started = std::time::Instant::now();
    let _ = read_pdf(&bytes);
    eprintln!("1 page of 8 MiB tiny operators, {} bytes PDF: read in {:?}", bytes.len(), started.elapsed());
    let mut doc = Document::load_mem(&pdf(&["x"])).unwrap();
    let page = *doc.get_pages().values().next().unwrap();
    let mut lines = Stream::new(dictionary! {}, b"T*\n".repeat(MAX_PAGE_CONTENT_BYTES / 3 - 64));
    lines.compress().unwrap();
    let lines = doc.add_object(lines);
    doc.get_object_mut(page).unwrap().as_dict_mut().unwrap().set("Contents", lines);
    let mut bytes = Vec::new();
    doc.save_to(&mut bytes).unwrap();
    let started = std::time::Instant::now();
    let _ = read_pdf(&bytes);
    eprintln!("1 page of 8 MiB tiny text operators, {} bytes PDF: read in {:?}", bytes.len(), started.elapsed());
    let noise: Vec<u8> = (0..4_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let started = std::time::Instant::now();
    let _ = read_pdf(&noise);
    eprintln!("4 MB of noise refused in {:?}", started.elapsed());
}
