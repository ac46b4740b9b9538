//! `GET /` and `GET /openapi.yaml`: what the server is and its contract,
//! without a token.

use std::path::{Path, PathBuf};

use payments_tests::{Answer, AppOptions, Backend, backend_tests, spawn_app};
use serde_json::Value;
use yaml_rust2::YamlLoader;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `version` in the `[package]` of `crates/api/Cargo.toml`.
fn api_crate_version() -> String {
    let manifest = std::fs::read_to_string(root().join("crates/api/Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .expect("payments-api's manifest has its own version");
    line.trim_matches('"').to_owned()
}

/// The index names the server and its version, and every link it lists
/// answers 200 without a token; the contract is the repository's file,
/// byte for byte, and documents every path the index links.
async fn the_index_links_answer_and_the_contract_is_served(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let get = |path: &str| app.http.get(format!("{}{path}", app.base_url)).send();

    let index = get("/").await.unwrap();
    assert_eq!(index.status(), 200);
    assert_eq!(index.headers()["content-type"], "application/json");
    let index: Value = index.json().await.unwrap();
    assert_eq!(index["name"], "payments-api");
    assert_eq!(index["version"], api_crate_version(), "{index}");
    let links = index["links"].as_object().expect("links");
    let mut names: Vec<&str> = links.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["healthz", "metrics", "openapi", "readyz"]);
    for (name, link) in links {
        let link = link.as_str().expect("a path");
        let answer = get(link).await.unwrap();
        assert_eq!(answer.status(), 200, "{name}: GET {link}");
    }

    let contract = get(links["openapi"].as_str().unwrap()).await.unwrap();
    assert_eq!(contract.headers()["content-type"], "application/yaml");
    let served = contract.bytes().await.unwrap();
    let file = std::fs::read(root().join("openapi.yaml")).unwrap();
    assert!(served == file, "GET /openapi.yaml is openapi.yaml as it is");

    // The contract documents the index and everything it links.
    let text = String::from_utf8(file).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("openapi.yaml is YAML");
    let paths = &docs[0]["paths"];
    let linked = links.values().filter_map(Value::as_str);
    for path in linked.chain(["/"]) {
        let get = &paths[path]["get"];
        assert!(!get.is_badvalue(), "openapi.yaml documents GET {path}");
        let security = get["security"].as_vec().map(Vec::len);
        assert_eq!(
            security,
            Some(0),
            "GET {path} needs no token (security: [])"
        );
    }
    let served_as = &paths["/openapi.yaml"]["get"]["responses"]["200"]["content"];
    assert!(
        !served_as["application/yaml"].is_badvalue(),
        "in application/yaml"
    );

    // Anything else is still a 404 in the envelope; `/` takes only GET.
    for unknown in ["/nope", "/openapi.yml", "/index.html", "/api"] {
        let answer = Answer::of(get(unknown).await.unwrap()).await;
        assert_eq!(answer.status, 404, "{unknown}");
        assert_eq!(answer.headers["content-type"], "application/json");
        assert_eq!(answer.body["error"]["code"], "not_found", "{unknown}");
    }
    let post = app.http.post(format!("{}/", app.base_url)).send();
    let answer = Answer::of(post.await.unwrap()).await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.body["error"]["code"], "method_not_allowed");
}

backend_tests!(the_index_links_answer_and_the_contract_is_served);
