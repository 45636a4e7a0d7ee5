use super::*;
use crate::install::ssh::fingerprint;

// Two ed25519 public keys (from `ssh-keygen -t ed25519`), without their comments.
const A: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIZMnIEaX5ioed+G128JMKEIp4LBwsvjxFGcdz5ImAqF";
const B: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO/UcyI3mQmmcHp3DjpRMurzrRFLMCRbPw3fcuUszP7+";

fn key(text: &str) -> PublicKey {
    PublicKey::from_openssh(text).expect("a public key")
}

/// The verdict on `presented` for `host:port` of the file `text`.
fn judge(text: &str, host: &str, port: u16, presented: &str) -> Verdict {
    verdict(&parse(text, host, port).unwrap(), &key(presented))
}

#[test]
fn given_a_revoked_key_when_the_host_presents_it_then_it_is_refused_whatever_else_the_file_says() {
    let text = format!("web-1 {A}\n# revoked after the leak\n@revoked * {A}\n");
    assert_eq!(judge(&text, "web-1", 22, A), Verdict::Revoked(3));
    assert_eq!(
        judge(&text, "web-2", 2222, A),
        Verdict::Revoked(3),
        "`*` covers every host and port"
    );
    // A key revoked for one host only.
    let one = format!("web-1 {A}\nweb-2 {A}\n@revoked\tweb-2 {A} a comment\n");
    assert_eq!(judge(&one, "web-1", 22, A), Verdict::Trusted);
    assert_eq!(judge(&one, "web-2", 22, A), Verdict::Revoked(3));
    // Another key revoked: the host's own still passes.
    let other = format!("web-1 {A}\n@revoked * {B}\n");
    assert_eq!(judge(&other, "web-1", 22, A), Verdict::Trusted);
    assert_eq!(judge(&other, "web-9", 22, B), Verdict::Revoked(2));
}

#[test]
fn given_a_cert_authority_line_then_it_is_never_taken_for_a_host_key() {
    let text = format!("@cert-authority *.example.com {A}\n");
    assert_eq!(
        judge(&text, "web-1.example.com", 22, A),
        Verdict::OnlyAuthority(1),
        "the CA's key presented as a host key is not trusted"
    );
    assert_eq!(
        judge(&text, "web-1.example.com", 22, B),
        Verdict::OnlyAuthority(1)
    );
    assert_eq!(judge(&text, "web-1", 22, A), Verdict::Unknown);
    let both = format!("@cert-authority * {A}\nweb-1 {B}\n");
    assert_eq!(judge(&both, "web-1", 22, B), Verdict::Trusted);
    assert_eq!(
        judge(&both, "web-1", 22, A),
        Verdict::Mismatch(vec![fingerprint(&key(B))])
    );
}

#[test]
fn patterns_glob_negate_name_ports_and_ignore_case() {
    let text = format!("web-*,!web-9 {A}\n[db-?]:2222 {B}\nWEB-X {B}\n");
    assert_eq!(judge(&text, "web-1", 22, A), Verdict::Trusted);
    assert_eq!(judge(&text, "web-9", 22, A), Verdict::Unknown, "negated");
    assert_eq!(
        judge(&text, "web-1", 2222, A),
        Verdict::Unknown,
        "another port"
    );
    assert_eq!(judge(&text, "db-1", 2222, B), Verdict::Trusted);
    assert_eq!(judge(&text, "db-1", 22, B), Verdict::Unknown);
    assert_eq!(judge(&text, "db-10", 2222, B), Verdict::Unknown);
    let x = parse(&text, "web-x", 22).unwrap();
    assert_eq!(x.keys.len(), 2, "web-* and WEB-X: {x:?}");
    assert_eq!(
        verdict(&x, &key(A)),
        Verdict::Trusted,
        "one of its keys is enough"
    );
}

#[test]
fn hashed_names_match_only_their_host() {
    let salt = b"0123456789abcdefghij".to_vec();
    let mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(&salt).unwrap();
    let hash: [u8; 20] = mac
        .chain_update(b"[web-1]:2222")
        .finalize()
        .into_bytes()
        .into();
    let hashed = HostPatterns::HashedName { salt, hash }.to_string();
    assert!(hashed.starts_with("|1|"), "{hashed}");
    let text = format!("{hashed} {A}\n@revoked {hashed} {B}\n");
    assert_eq!(judge(&text, "web-1", 2222, A), Verdict::Trusted);
    assert_eq!(judge(&text, "web-1", 2222, B), Verdict::Revoked(2));
    assert_eq!(judge(&text, "web-1", 22, A), Verdict::Unknown);
    assert_eq!(judge(&text, "web-2", 2222, A), Verdict::Unknown);
}

#[test]
fn a_misspelt_marker_or_a_short_line_is_an_error_naming_the_line() {
    let typo = format!("web-1 {A}\n@revokd * {A}\n");
    let err = parse(&typo, "web-1", 22).unwrap_err();
    assert!(
        matches!(&err, KnownHostsError::Marker { line: 2, marker } if marker == "@revokd"),
        "{err:?}"
    );
    let short = parse("web-1 ssh-ed25519\n", "web-2", 22).unwrap_err();
    assert!(
        matches!(short, KnownHostsError::Fields { line: 1 }),
        "{short:?}"
    );
    let marker_only = parse("@revoked web-1\n", "web-1", 22).unwrap_err();
    assert!(
        matches!(marker_only, KnownHostsError::Fields { line: 1 }),
        "{marker_only:?}"
    );
    // A key that cannot be read: an error on a line for the host, skipped on another's.
    let bad = "web-1 ssh-ed25519 AAAAnot-base64\n";
    assert!(matches!(
        parse(bad, "web-1", 22),
        Err(KnownHostsError::Key { line: 1, .. })
    ));
    assert_eq!(parse(bad, "web-2", 22).unwrap(), ForHost::default());
}

#[test]
fn a_missing_file_says_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        read(&dir.path().join("none"), "web-1", 22).unwrap(),
        ForHost::default()
    );
}
