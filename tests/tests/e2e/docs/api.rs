//! `docs/api.md` is the HTTP API's reference: it names the served description
//! (`GET /v1/openapi.json`, `coordinator/src/openapi.json`), every route of that
//! description is in it and it has no other, and every code of the API's own (the
//! protocol's are in `docs/protocol.md`) is in it.

use capstan_tests::docs;
use regex::Regex;
use std::collections::BTreeSet;

/// The routes (`METHOD /path`) of `docs/api.md`'s tables: a row whose first cell
/// begins with one, its query left out.
fn routes_in(text: &str) -> BTreeSet<String> {
    let route =
        Regex::new(r"^`(GET|POST|PUT|DELETE|PATCH) (/[^`?\s]*)").expect("the route pattern");
    docs::tables(text)
        .iter()
        .flat_map(|t| t.rows.iter())
        .filter_map(|(_, row)| {
            let c = route.captures(row.first()?)?;
            Some(format!("{} {}", &c[1], &c[2]))
        })
        .collect()
}

/// The routes of the OpenAPI description.
fn routes_of(description: &serde_json::Value) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for (path, item) in description["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                routes.insert(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    routes
}

#[test]
fn docs_api_has_every_route_of_the_served_description_and_no_other() {
    let api = docs::read("docs/api.md");
    for name in ["GET /v1/openapi.json", "coordinator/src/openapi.json"] {
        assert!(api.contains(name), "docs/api.md does not name {name}");
    }
    let description: serde_json::Value =
        serde_json::from_str(&docs::read("coordinator/src/openapi.json")).expect("openapi.json");
    let served = routes_of(&description);
    assert!(served.len() > 10, "{served:?}");
    let documented = routes_in(&api);
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/api.md against openapi.json: missing {missing:?}, not served {extra:?}"
    );
}

#[test]
fn docs_api_names_every_code_the_api_answers_with() {
    let api = docs::read("docs/api.md");
    // The protocol's codes are in docs/protocol.md (`names`); the API's own here.
    let protocol = super::names::protocol_codes();
    let own: Vec<String> = super::names::api_codes()
        .into_iter()
        .filter(|c| !protocol.contains(c))
        .collect();
    assert!(own.len() > 10, "{own:?}");
    let missing: Vec<&String> = own
        .iter()
        .filter(|c| !api.contains(&format!("`{c}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "codes docs/api.md does not name: {missing:?}"
    );
}

#[test]
fn a_route_missing_or_extra_is_found() {
    let description = serde_json::json!({"paths": {
        "/v1/hosts": {"get": {}},
        "/v1/hosts/{host}/keys": {"get": {}, "put": {}, "parameters": []},
    }});
    let text = "| request | answer |\n|---|---|\n| `GET /v1/hosts?x=1` | list |\n\
                | `PUT /v1/hosts/{host}/keys` (role `submit`) | add |\n| `POST /v1/hosts` | no |\n";
    let served = routes_of(&description);
    let documented = routes_in(text);
    assert_eq!(
        served.difference(&documented).collect::<Vec<_>>(),
        ["GET /v1/hosts/{host}/keys"]
    );
    assert_eq!(
        documented.difference(&served).collect::<Vec<_>>(),
        ["POST /v1/hosts"]
    );
}
