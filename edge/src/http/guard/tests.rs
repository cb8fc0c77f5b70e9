use super::*;

#[test]
fn only_json_content_types_pass() {
    for ok in ["application/json", "application/json; charset=utf-8", "Application/JSON", " application/json ;x=y"] {
        assert!(is_json(&HeaderValue::from_static(ok)), "{ok}");
    }
    for bad in [
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json-patch+json",
        "",
    ] {
        assert!(!is_json(&HeaderValue::from_static(bad)), "{bad}");
    }
}

#[test]
fn only_this_machines_names_are_local_hosts() {
    let v4 = Some(SocketAddr::from(([10, 1, 2, 3], 8080)));
    let v6: Option<SocketAddr> = Some("[fd00::7]:8081".parse().unwrap());
    for (host, local) in [
        ("localhost", None),
        ("LOCALHOST:8080", None),
        ("127.0.0.1:8080", None),
        ("127.0.0.1", v4),
        ("[::1]:8081", None),
        ("[::1]", None),
        ("10.1.2.3:8080", v4),
        ("10.1.2.3", v4),
        ("[fd00::7]:8081", v6),
        ("10.1.2.3:8080", Some("[::ffff:10.1.2.3]:8080".parse().unwrap())),
    ] {
        assert!(is_local_host(host, local), "{host}");
    }
    for (host, local) in [
        ("evil.example", v4),
        ("evil.example:8080", None),
        ("localhost.evil.example", None),
        ("127.0.0.1.nip.io", None),
        ("10.1.2.3:8080", None),
        ("10.1.2.4:8080", v4),
        ("[fd00::7]", v4),
        ("localhost:", None),
        ("localhost:80:80", None),
        ("localhost:abc", None),
        ("[::1", None),
        ("[::1]x", None),
        ("", None),
    ] {
        assert!(!is_local_host(host, local), "{host}");
    }
}
