//! Unit tests of the `[nats]` config section: its URLs, replicas and keys.

use super::*;

fn parse(toml_text: &str) -> Result<NatsConfig, String> {
    toml::from_str(toml_text).map_err(|e| e.to_string())
}

fn hosts(config: &NatsConfig) -> Vec<String> {
    config
        .servers()
        .expect("servers")
        .into_iter()
        .map(|s| {
            let url = s.into_inner();
            format!(
                "{}://{}:{}",
                url.scheme(),
                url.host_str().unwrap(),
                url.port().unwrap()
            )
        })
        .collect()
}

#[test]
fn one_url_is_one_server() {
    let config = parse(r#"url = "nats://10.0.0.5:4222""#).unwrap();
    assert_eq!(config.url, "nats://10.0.0.5:4222");
    assert_eq!(hosts(&config), ["nats://10.0.0.5:4222"]);
    config.validate().unwrap();
}

#[test]
fn without_url_the_local_default_is_used() {
    let config = parse("").unwrap();
    assert_eq!(hosts(&config), ["nats://127.0.0.1:4222"]);
    assert_eq!(config.replicas, 1);
}

#[test]
fn a_comma_separated_url_is_a_list_of_servers() {
    let config = parse(r#"url = "nats://a:4301,nats://b:4302, tls://c:4303""#).unwrap();
    assert_eq!(
        hosts(&config),
        ["nats://a:4301", "nats://b:4302", "tls://c:4303"]
    );
    config.validate().unwrap();
}

#[test]
fn an_array_of_urls_is_a_list_of_servers() {
    let config = parse(r#"url = ["nats://a:4301", "nats://b:4302"]"#).unwrap();
    assert_eq!(config.url, "nats://a:4301,nats://b:4302");
    assert_eq!(hosts(&config), ["nats://a:4301", "nats://b:4302"]);
}

#[test]
fn an_array_entry_with_a_comma_is_refused() {
    let e = parse(r#"url = ["nats://a:4301,nats://b:4302"]"#).unwrap_err();
    assert!(e.contains("one URL per array entry"), "{e}");
}

#[test]
fn a_url_that_is_neither_string_nor_array_is_refused() {
    assert!(parse("url = 4222").is_err());
    assert!(parse("url = [4222]").is_err());
}

#[test]
fn the_bad_server_is_named() {
    let config = parse(r#"url = "nats://a:4301,nats://b:port""#).unwrap();
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains(r#""nats://b:port" is not a NATS server URL"#),
        "{e}"
    );
    assert!(!e.contains("a:4301"), "{e}");

    let config = parse(r#"url = ["nats://a:4301", "http://b:4302"]"#).unwrap();
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains(r#""http://b:4302""#) && e.contains("scheme"),
        "{e}"
    );
}

#[test]
fn an_empty_entry_is_refused() {
    for url in [r#""nats://a:4301,,nats://b:4302""#, r#""""#, r#"[]"#] {
        let config = parse(&format!("url = {url}")).unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains("is empty"), "{url}: {e}");
    }
}

#[test]
fn a_password_in_a_bad_url_is_not_shown() {
    let config = parse(r#"url = "nats://u:secret@a:99999""#).unwrap();
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains("nats://…@a:99999") && !e.contains("secret"),
        "{e}"
    );
}
#[test]
fn replicas_are_one_to_five() {
    for n in 1..=5 {
        let config = parse(&format!("replicas = {n}")).unwrap();
        assert_eq!(config.replicas, n);
        config.validate().unwrap();
    }
    for n in [0, 6] {
        let config = parse(&format!("replicas = {n}")).unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains(&format!("`replicas` is {n}")), "{e}");
    }
    assert!(parse("replicas = -1").is_err());
}

#[test]
fn unknown_keys_are_refused() {
    let e = parse("urls = []").unwrap_err();
    assert!(e.contains("urls"), "{e}");
}

#[test]
fn the_first_connection_attempt_is_not_delayed() {
    assert_eq!(super::reconnect_delay(1), Duration::ZERO);
    assert_eq!(super::reconnect_delay(2), Duration::from_millis(100));
    assert_eq!(super::reconnect_delay(5), Duration::from_millis(400));
    assert_eq!(super::reconnect_delay(50), Duration::from_secs(1));
}
