use super::*;

#[test]
fn escaping() {
    assert_eq!(xml_escape(r#"a & <b> "c" 'd'"#), "a &amp; &lt;b&gt; &quot;c&quot; &apos;d&apos;");
    assert_eq!(systemd_quote(r#"/a b/1%$HOME\"x"#), r#""/a b/1%%$$HOME\\\"x""#);
    assert_eq!(systemd_quote_exe("/a b/1%$HOME/iop-node"), r#""/a b/1%%$HOME/iop-node""#);
    assert!(systemd_exe_problem("/a b/1%$HOME & co/iop-node").is_none());
    for bad in [r#"/a"b/iop-node"#, "/a'b/iop-node", r"/a\b/iop-node"] {
        assert!(systemd_exe_problem(bad).is_some(), "{bad}");
    }
}
