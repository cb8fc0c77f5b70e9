use super::*;

const NODE: &str = "spiffe://iop.local/node/mac-1";

fn binding() -> pb::LeaseBinding {
    pb::LeaseBinding { lease_id: "l1".into(), execution_id: "r1".into(), generation: 7, ..Default::default() }
}

#[test]
fn a_sealed_lease_opens_with_its_key_for_its_node_only() {
    let key = LeaseKey::generate();
    assert_eq!(key.public_key().len(), PUBLIC_KEY_LEN);
    let sealed = seal(key.public_key(), NODE, &binding(), b"sk-secret").unwrap();
    assert!(!sealed.ciphertext.windows(9).any(|w| w == b"sk-secret"), "the credential is not in the clear");
    let opened = key.open(NODE, &sealed).unwrap();
    assert_eq!((opened.binding, opened.credential.as_slice()), (binding(), &b"sk-secret"[..]));

    // Another node's identity, another key, any altered byte: no open.
    assert_eq!(key.open("spiffe://iop.local/node/mac-2", &sealed).err(), Some(LeaseCryptoError::Open));
    assert_eq!(LeaseKey::generate().open(NODE, &sealed).err(), Some(LeaseCryptoError::Open));
    for field in 0..3 {
        let mut altered = sealed.clone();
        let bytes = match field {
            0 => &mut altered.binding,
            1 => &mut altered.encapped_key,
            _ => &mut altered.ciphertext,
        };
        bytes[0] ^= 1;
        assert!(key.open(NODE, &altered).is_err(), "field {field}");
    }
}

#[test]
fn credential_values_are_trimmed_printable_ascii_within_the_limit() {
    assert_eq!(check_credential(b"sk-1\n"), Ok(&b"sk-1"[..]));
    assert_eq!(check_credential(b"  \tsk-1 \r\n"), Ok(&b"sk-1"[..]));
    let max = vec![b'k'; MAX_CREDENTIAL_BYTES];
    assert_eq!(check_credential(&max), Ok(&max[..]));
    assert_eq!(check_credential(b""), Err(CredentialValueError::Empty));
    assert_eq!(check_credential(b" \n\t"), Err(CredentialValueError::Empty));
    assert_eq!(check_credential(&vec![b'k'; MAX_CREDENTIAL_BYTES + 1]), Err(CredentialValueError::TooLong));
    for bad in [&b"sk 1"[..], b"sk-\x001", b"sk-\x7f", b"sk-\x1b[0m", "sk-\u{e9}".as_bytes(), b"a\nb"] {
        assert_eq!(check_credential(bad), Err(CredentialValueError::NotPrintable), "{bad:?}");
    }
    // The error never carries the value.
    let e = check_credential(b"secret value").unwrap_err();
    assert!(!e.to_string().contains("secret") && !format!("{e:?}").contains("secret"));
}

#[test]
fn a_bad_public_key_cannot_be_sealed_to() {
    assert_eq!(seal(&[1, 2, 3], NODE, &binding(), b"x").err(), Some(LeaseCryptoError::InvalidPublicKey));
}
