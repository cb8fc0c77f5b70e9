use super::*;

#[test]
fn hosted_kinds_are_a_closed_list() {
    assert_eq!(openai_kind("web_search"), Some("web_search"));
    assert_eq!(openai_kind("web_search_preview_2025_03_11"), Some("web_search"));
    assert_eq!(openai_kind("file_search"), Some("file_search"));
    assert_eq!(openai_kind("function"), None);
    assert_eq!(openai_kind("namespace"), None);
    // Issue 45 item 4: Codex's tool_search is dropped; custom tools are served.
    assert_eq!(openai_kind("tool_search"), Some("tool_search"));
    assert_eq!(openai_kind("custom"), None);
    assert_eq!(openai_kind("web_search_evil"), None);
    assert_eq!(anthropic_kind("web_search_20250305"), Some("web_search"));
    assert_eq!(anthropic_kind("web_fetch_20250910"), Some("web_fetch"));
    assert_eq!(anthropic_kind("code_execution_20250825"), Some("code_execution"));
    assert_eq!(anthropic_kind("tool_search_tool_regex_20251119"), Some("tool_search"));
    assert_eq!(anthropic_kind("web_search_"), None);
    assert_eq!(anthropic_kind("web_search_x1"), None);
    assert_eq!(anthropic_kind("bash_20250124"), None);
    assert_eq!(anthropic_kind("custom"), None);
}

#[test]
fn the_header_names_each_kind_once() {
    let tool = |kind| DroppedTool { path: "tools[0]".into(), kind };
    assert_eq!(header_value(&[tool("web_search"), tool("mcp"), tool("web_search")]), "web_search, mcp");
    let refused = refusal(&DroppedTool { path: "tools[4]".into(), kind: "web_search" });
    assert_eq!(refused.code(), "invalid_request");
    assert!(refused.message().starts_with("tools[4]: `web_search` is a hosted tool"), "{}", refused.message());
}
