//! The Docker files, checked without Docker (no engine on this project's
//! machines or CI): `docker/Dockerfile`, `docker/compose.yaml` and
//! `docker/grafana-dashboard.json` must agree with the workspace they ship.
//!
//! - The Dockerfile builds release, locked, without default features, and
//!   copies exactly the shipped `[[bin]]`s; its dependency layer lists every
//!   workspace member; the image runs as non-root; the API reads its `ENV`s.
//! - Compose runs only real binaries, subcommands and flags, and sets only
//!   variables the binary reads (`[env: NAME` in its `--help`); the API and
//!   the jobs accept its configuration (and would refuse the sandbox's key or
//!   the development secret); the services agree on the database, provider,
//!   start order and health checks.
//! - The dashboard and `docs/rollout.md` name only the metrics the binaries
//!   record (`payments_api::telemetry::{COUNTERS, HISTOGRAMS}`), and the
//!   dashboard shows them all.
//! - The docs run the binaries `make run` built, never `cargo run`
//!   (`docs.rs`).
//! - No migration is edited once it has landed (`migrations.rs`).
#![allow(clippy::unwrap_used)]

mod docs;
mod links;
mod logs;
mod migrations;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use payments_api::config::DEV_JWT_SECRET;
use payments_api::telemetry::{COUNTERS, GAUGES, HISTOGRAMS};
use payments_app::settings::SANDBOX_SECRET_KEY;
use payments_tests::{binary, run_binary};
use reqwest::Url;
use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// What the image must hold: the API, the jobs, the sandbox and the smoke test.
const SHIPPED: [&str; 4] = [API, "payments-jobs", "payments-sandbox", "payments-smoke"];
const API: &str = "payments-api";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The workspace as cargo sees it: the member directories (`crates/api`),
/// and each binary's package.
fn workspace() -> (BTreeSet<String>, BTreeMap<String, String>) {
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["metadata", "--no-deps", "--format-version", "1"]);
    let output = cargo.current_dir(root()).output().unwrap();
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata");
    let workspace_root = metadata["workspace_root"].as_str().unwrap();
    let (mut members, mut bins) = (BTreeSet::new(), BTreeMap::new());
    for package in metadata["packages"].as_array().unwrap() {
        let manifest = package["manifest_path"].as_str().unwrap();
        let dir = manifest.strip_prefix(workspace_root).unwrap();
        members.insert(dir[1..].trim_end_matches("/Cargo.toml").to_owned());
        for target in package["targets"].as_array().unwrap() {
            if target["kind"][0] == "bin" {
                let name = target["name"].as_str().unwrap().to_owned();
                bins.insert(name, package["name"].as_str().unwrap().to_owned());
            }
        }
    }
    (members, bins)
}

/// The built binary's `--help` for a command line's binary and subcommands
/// (its leading words). Panics if either does not exist.
fn help(argv: &[String]) -> String {
    let words = argv.iter().take_while(|w| !w.starts_with('-'));
    let words: Vec<&str> = words.map(String::as_str).collect();
    let mut command = Command::new(binary(words[0]));
    let output = command.args(&words[1..]).arg("--help").env_clear().output();
    let output = output.unwrap();
    let words = words.join(" ");
    assert!(output.status.success(), "`{words} --help` failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The variables a `--help` lists (`[env: NAME]` or `[env: NAME=value]`).
fn env_vars_in_help(help: &str) -> BTreeSet<String> {
    let name = |c: &char| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_';
    let names = help.split("[env: ").skip(1);
    let names = names.map(|rest| rest.chars().take_while(name).collect());
    names.collect()
}

// ---------------------------------------------------------------------------
// docker/Dockerfile.

/// One stage (from its `FROM`): its instructions, each as its words.
type Stage = Vec<Vec<String>>;

/// The stages, continuation lines joined and comments dropped (the global
/// `ARG`s before the first `FROM` too).
fn dockerfile() -> Vec<Stage> {
    let text = read("docker/Dockerfile").replace("\\\n", " ");
    let mut stages: Vec<Stage> = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let words: Vec<String> = line.split_whitespace().map(Into::into).collect();
        match words.first().map(String::as_str) {
            Some("FROM") => stages.push(vec![words]),
            Some(_) if !stages.is_empty() => stages.last_mut().unwrap().push(words),
            _ => {} // a blank line, or a global ARG
        }
    }
    stages
}

/// The arguments of a stage's instructions of one kind.
fn all<'a>(stage: &'a Stage, keyword: &'a str) -> impl Iterator<Item = Vec<&'a str>> {
    let matching = stage.iter().filter(move |i| i[0] == keyword);
    matching.map(|i| i[1..].iter().map(String::as_str).collect())
}

/// The values of `flag` in `words`, as `flag value` or `flag=value`.
fn flag_values<'a, S: AsRef<str>>(words: &'a [S], flag: &str) -> Vec<&'a str> {
    let mut values = Vec::new();
    for (i, word) in words.iter().map(S::as_ref).enumerate() {
        if word == flag {
            values.extend(words.get(i + 1).map(S::as_ref));
        } else if let Some(value) = word.strip_prefix(flag).and_then(|w| w.strip_prefix('=')) {
            values.push(value);
        }
    }
    values
}

/// The paths a `COPY` names (sources, then its destination) without flags.
fn paths<'a>(copy: &[&'a str]) -> Vec<&'a str> {
    let paths = copy.iter().filter(|w| !w.starts_with("--"));
    paths.copied().collect()
}

/// The exec-form `CMD` of the final stage.
fn image_cmd(stages: &[Stage]) -> Vec<String> {
    let cmd = all(stages.last().unwrap(), "CMD").last().expect("a CMD");
    serde_json::from_str(&cmd.join(" ")).expect("CMD in exec form")
}

#[test]
fn the_dockerfile_builds_and_ships_the_four_binaries_without_default_features() {
    let (_, bins) = workspace();
    let stages = dockerfile();
    let (builder, runtime) = (&stages[0], stages.last().unwrap());
    let base = &builder[0][1];
    assert!(base.starts_with("rust:"), "the builder is {base}");
    let builder_name = builder[0].get(3).expect("a named builder stage").as_str();

    // The `cargo build` commands of its `RUN`s.
    let runs: Vec<Vec<&str>> = all(builder, "RUN").collect();
    let commands = runs.iter().flat_map(|run| run.split(|w| *w == "&&"));
    let cargo_build = |c: &&[&str]| c.starts_with(&["cargo", "build"]);
    let builds: Vec<&[&str]> = commands.filter(cargo_build).collect();
    let packages = |build| BTreeSet::from_iter(flag_values(build, "-p"));
    let mut built = BTreeSet::new();
    for &build in &builds {
        let (line, selected) = (build.join(" "), packages(build));
        // Default features are for development: none may reach the image.
        for flag in ["--release", "--locked", "--no-default-features"] {
            assert!(build.contains(&flag), "`{line}` lacks {flag}");
        }
        assert!(selected.contains("payments-api"), "`{line}`: no API");
        // The dependency layer builds the same packages, so its artifacts are reused.
        assert_eq!(selected, packages(builds[0]), "the same -p in every build");
        for bin in flag_values(build, "--bin") {
            let package = bins.get(bin).expect("a [[bin]] of the workspace");
            let package = package.as_str();
            assert!(selected.contains(package), "`{line}` lacks -p {package}");
            built.insert(bin);
        }
    }
    assert_eq!(built, BTreeSet::from(SHIPPED), "binaries built (--bin)");

    // The final stage copies exactly those from the builder's release dir to the PATH.
    let from_builder = all(runtime, "COPY").filter(|c| flag_values(c, "--from") == [builder_name]);
    let (mut copied, release) = (BTreeSet::new(), "/src/target/release/");
    for copy in from_builder {
        let mut sources = paths(&copy);
        assert_eq!(sources.pop(), Some("/usr/local/bin/"), "on the PATH");
        copied.extend(sources.iter().map(|p| p.strip_prefix(release).unwrap_or(p)));
    }
    assert_eq!(copied, BTreeSet::from(SHIPPED), "copied from {release}");
}

#[test]
fn the_dependency_layer_lists_every_workspace_member() {
    let (members, _) = workspace();
    let builder = &dockerfile()[0];
    let copies = all(builder, "COPY").flat_map(|c| paths(&c));
    let copied: BTreeSet<&str> = copies.map(|p| p.trim_start_matches("./")).collect();
    let manifests = members.iter().map(|member| format!("{member}/Cargo.toml"));
    for file in manifests.chain(["Cargo.toml".into(), "Cargo.lock".into()]) {
        // Else cargo cannot load the workspace in the dependency layer.
        assert!(copied.contains(&*file), "the Dockerfile lacks {file}");
    }
    // sqlx::migrate! compiles the migrations into the binaries, and
    // include_str! the files a crate reads from outside `crates/`
    // (openapi.yaml): each is copied before the binaries are built.
    let position = |what: &str| builder.iter().position(|i| i.iter().any(|w| w == what));
    let build = position("--bin");
    for needed in ["migrations".to_owned()]
        .into_iter()
        .chain(compiled_in_from_outside())
    {
        let copied = position(&needed);
        assert!(
            copied.is_some() && copied < build,
            "{needed} is copied before the build"
        );
    }
}

/// The files outside `crates/` that a crate compiles in (`include_str!` or
/// `include_bytes!` of a path that leaves `crates/`), relative to the root.
fn compiled_in_from_outside() -> BTreeSet<String> {
    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let root = root().canonicalize().unwrap();
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    let mut outside = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for macro_call in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_call) {
                let rest = &text[at + macro_call.len()..];
                let literal = &rest[..rest.find('"').unwrap()];
                let included = file.parent().unwrap().join(literal).canonicalize().unwrap();
                let relative = included.strip_prefix(&root).unwrap();
                if !relative.starts_with("crates") {
                    outside.insert(relative.to_str().unwrap().to_owned());
                }
            }
        }
    }
    assert!(
        outside.contains("openapi.yaml"),
        "payments-api serves the contract"
    );
    outside
}

#[test]
fn the_runtime_image_is_small_non_root_and_serves_the_api() {
    let stages = dockerfile();
    let runtime = stages.last().unwrap();
    let base = &runtime[0][1];
    let slim = base.starts_with("debian:") && base.ends_with("-slim");
    assert!(slim || base.contains("distroless"), "a base of {base}");
    let user = all(runtime, "USER").last().expect("a USER").join(" ");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as root: USER {user}");
    assert!(all(runtime, "WORKDIR").next().is_some(), "a WORKDIR");
    let mut exposed = all(runtime, "EXPOSE").flatten();
    assert!(exposed.any(|port| port == "8080"), "EXPOSE 8080");
    let cmd = image_cmd(&stages);
    assert_eq!(cmd, ["payments-api"], "the default command serves the API");

    // Every ENV of the image is read by its default binary.
    let read = env_vars_in_help(&help(&cmd));
    for env in all(runtime, "ENV") {
        let name = env[0].split('=').next().unwrap();
        assert!(read.contains(name), "the API ignores ENV {name}");
    }
}

// ---------------------------------------------------------------------------
// docker/compose.yaml.

/// YAML as JSON, every scalar a string; merge keys (`<<: *anchor`, which
/// compose reads) give their map's entries to the map they are in, below
/// its own.
fn json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Hash(map) => {
            let key = |k| json(k).as_str().unwrap().to_owned();
            let mut object = Map::new();
            for (_, v) in map.iter().filter(|(k, _)| key(k) == "<<") {
                let merged = json(v);
                let merged = merged.as_object().expect("a merge key names a map");
                object.extend(merged.clone());
            }
            for (k, v) in map.iter().filter(|(k, _)| key(k) != "<<") {
                object.insert(key(k), json(v));
            }
            Value::Object(object)
        }
        Yaml::Array(items) => items.iter().map(json).collect(),
        Yaml::String(s) | Yaml::Real(s) => s.as_str().into(),
        Yaml::Integer(i) => i.to_string().into(),
        Yaml::Boolean(b) => b.to_string().into(),
        _ => Value::Null,
    }
}

/// A compose file, as JSON (anchors resolved).
fn compose_file(relative: &str) -> Value {
    let docs = YamlLoader::load_from_str(&read(relative)).expect("valid YAML");
    json(&docs[0])
}

/// `docker/compose.yaml`'s services.
fn compose() -> Map<String, Value> {
    let services = compose_file("docker/compose.yaml")["services"]
        .as_object()
        .cloned();
    services.expect("services")
}

/// The image docker/Dockerfile builds, as the compose files tag it.
const IMAGE: &str = "payments:local";

/// The services built from docker/Dockerfile or running the image it built,
/// with their commands (the image's `CMD` where they give none).
fn ours(services: &Map<String, Value>) -> BTreeMap<&str, Vec<String>> {
    let dockerfile = root().join("docker/Dockerfile").canonicalize().unwrap();
    let mut ours = BTreeMap::new();
    for (name, service) in services.iter().filter(|(_, s)| s["image"] == IMAGE) {
        let command = serde_json::from_value(service["command"].clone());
        let command = command.unwrap_or_else(|_| image_cmd(&self::dockerfile()));
        ours.insert(name.as_str(), command);
        if !service["build"].is_object() {
            continue;
        }
        let build = |key| service["build"][key].as_str();
        let file = root().join("docker").join(build("context").unwrap());
        let file = file.join(build("dockerfile").unwrap_or("Dockerfile"));
        let file = file.canonicalize().unwrap();
        assert_eq!(file, dockerfile, "{name}'s Dockerfile");
    }
    // Built once: every other service runs what that one built, rather
    // than building its own copy of the same tag.
    let builders: Vec<&String> = services
        .iter()
        .filter(|(_, s)| s["build"].is_object() && s["image"] == IMAGE)
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        builders.len(),
        1,
        "exactly one service builds {IMAGE}: {builders:?}"
    );
    ours
}

/// A variable a service sets (its `environment`, a map).
fn env<'a>(service: &'a Value, name: &str) -> &'a str {
    let value = service["environment"][name].as_str();
    value.unwrap_or_else(|| panic!("{name} is not set"))
}

/// The port of `host:port` or `scheme://host:port`.
fn port(address: &str) -> &str {
    address.rsplit_once(':').expect("host:port").1
}

/// Where the sandbox service listens (`--listen`).
fn sandbox_port(services: &Map<String, Value>) -> String {
    port(flag_values(&ours(services)["sandbox"], "--listen")[0]).to_owned()
}

/// The sandbox's fault injection (`/_sandbox/config`) is reachable from
/// the host, on loopback only, at the port the README's session uses.
fn the_sandbox_is_published_on_loopback(services: &Map<String, Value>) {
    let inside = sandbox_port(services);
    let ports = services["sandbox"]["ports"]
        .as_array()
        .expect("sandbox ports");
    let published = format!("127.0.0.1:12111:{inside}");
    assert!(
        ports.iter().any(|p| p.as_str() == Some(published.as_str())),
        "the sandbox publishes {published}: {ports:?}"
    );
}

#[test]
fn both_compose_files_publish_the_sandbox_for_fault_injection() {
    the_sandbox_is_published_on_loopback(&compose());
    let cluster = compose_file("docker/compose.cluster.yaml")["services"].clone();
    the_sandbox_is_published_on_loopback(cluster.as_object().expect("services"));
}

/// Every service of ours runs a shipped binary, with flags and variables
/// that binary reads.
fn runs_only_real_binaries_with_real_flags_and_variables(services: &Map<String, Value>) {
    let (_, bins) = workspace();
    for (name, command) in ours(services) {
        let program = command[0].as_str();
        assert!(bins.contains_key(program), "{name}: {program}: no [[bin]]");
        assert!(SHIPPED.contains(&program), "{name}: {program}: unshipped");
        let help = help(&command);
        for flag in command.iter().filter(|w| w.starts_with("--")) {
            let flag = flag.split('=').next().unwrap();
            let listed = help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n"));
            assert!(listed, "{name}: {program} has no {flag}");
        }
        // A misspelt or invented variable would be silently ignored. RUST_LOG,
        // the log filter, is read outside clap, so absent from `--help`.
        let read = env_vars_in_help(&help);
        assert!(!read.is_empty(), "{name}: no [env: ...] in --help");
        let set = services[name]["environment"].as_object().into_iter();
        let unread = set.flat_map(|env| env.keys());
        let unread = unread.filter(|k| !read.contains(*k) && *k != "RUST_LOG");
        let unread: Vec<&String> = unread.collect();
        assert!(unread.is_empty(), "{name}: {unread:?}; reads {read:?}");
    }
}

#[test]
fn compose_runs_only_real_binaries_with_real_flags_and_variables() {
    let services = compose();
    runs_only_real_binaries_with_real_flags_and_variables(&services);
    let command = |name| ours(&services)[name].join(" ");
    assert_eq!(command("migrate"), "payments-api migrate");
    assert_eq!(command("api"), "payments-api");
    assert_eq!(command("jobs"), "payments-jobs run");
    assert!(command("sandbox").starts_with("payments-sandbox --listen 0.0.0.0:"));
}

#[test]
fn the_services_share_one_database_and_provider_and_wait_for_each_other() {
    let s = compose();
    let url = env(&s["api"], "DATABASE_URL");
    for name in ["migrate", "jobs"] {
        assert_eq!(env(&s[name], "DATABASE_URL"), url, "{name}'s database");
    }
    let (url, postgres) = (Url::parse(url).unwrap(), &s["postgres"]);
    assert!(["postgres", "postgresql"].contains(&url.scheme()));
    assert_eq!(url.host_str(), Some("postgres"), "the postgres service");
    assert_eq!(url.port(), Some(5432));
    assert_eq!(url.username(), env(postgres, "POSTGRES_USER"));
    assert_eq!(url.password(), Some(env(postgres, "POSTGRES_PASSWORD")));
    assert_eq!(url.path(), format!("/{}", env(postgres, "POSTGRES_DB")));

    let waits = [
        ("migrate", "postgres", "service_healthy"),
        ("api", "postgres", "service_healthy"),
        ("api", "sandbox", "service_healthy"),
        ("api", "migrate", "service_completed_successfully"),
        ("jobs", "postgres", "service_healthy"),
        ("jobs", "sandbox", "service_healthy"),
        ("jobs", "migrate", "service_completed_successfully"),
    ];
    for (name, on, condition) in waits {
        let found = &s[name]["depends_on"][on]["condition"];
        assert_eq!(found, condition, "{name} waits for {on}");
    }

    // Provider, lease and timeout must agree between everything that drives a charge.
    for var in "GATEWAY_URL GATEWAY_SECRET_KEY LEASE GATEWAY_TIMEOUT".split(' ') {
        let [api, jobs] = ["api", "jobs"].map(|name| &s[name]["environment"][var]);
        assert_eq!(api, jobs, "{var} differs between api and jobs");
    }
    let gateway = Url::parse(env(&s["api"], "GATEWAY_URL")).unwrap();
    let gateway = (gateway.host_str(), gateway.port().map(|p| p.to_string()));
    let sandbox = (Some("sandbox"), Some(sandbox_port(&s)));
    assert_eq!(gateway, sandbox, "GATEWAY_URL is where the sandbox listens");
    assert!(!env(&s["api"], "GATEWAY_SECRET_KEY").is_empty());
}

#[test]
fn health_checks_probe_the_right_ports_and_paths() {
    let s = compose();
    let check = |name: &str| s[name]["healthcheck"]["test"].to_string();
    assert!(check("postgres").contains("pg_isready"), "postgres");
    let sandbox = format!(":{}/healthz", sandbox_port(&s));
    assert!(check("sandbox").contains(&sandbox), "{}", check("sandbox"));
    let api_port = port(env(&s["api"], "LISTEN_ADDR"));
    let api = format!(":{api_port}/readyz");
    assert!(check("api").contains(&api), "{}", check("api"));
    let published = s["api"]["ports"].as_array().unwrap().iter();
    let mut ports = published.map(|p| port(p.as_str().unwrap()));
    assert!(ports.any(|p| p == api_port), "the api publishes {api_port}");
}

#[test]
fn no_service_uses_the_sandbox_key_or_the_development_secret() {
    let services = compose();
    for (name, service) in &services {
        for secret in [SANDBOX_SECRET_KEY, DEV_JWT_SECRET] {
            let uses = service.to_string().contains(secret);
            assert!(!uses, "{name} uses a development secret");
        }
    }
    let secret = env(&services["api"], "JWT_HS256_SECRET");
    assert!(secret.len() >= 32, "JWT_HS256_SECRET is at least 32 bytes");
}

/// Runs a compose service's command with its environment, its database
/// moved to a closed local port: a configuration the binary accepts gets as
/// far as opening the database, one it refuses stops before.
async fn start_with_compose_env(name: &str, overrides: &[(&str, &str)]) -> String {
    let services = compose();
    let command = ours(&services)[name].clone();
    let set = services[name]["environment"].as_object().unwrap().iter();
    let set = set.map(|(k, v)| (k.as_str(), v.as_str().unwrap()));
    let mut env: BTreeMap<&str, &str> = set.collect();
    let mut db = Url::parse(env["DATABASE_URL"]).unwrap();
    db.set_host(Some("127.0.0.1")).unwrap();
    db.set_port(Some(1)).unwrap();
    let db = db.to_string();
    env.insert("DATABASE_URL", &db);
    env.insert("DATABASE_ACQUIRE_TIMEOUT", "500ms");
    env.extend(overrides.iter().copied());
    let env: Vec<(&str, &str)> = env.into_iter().collect();
    let mut args: Vec<&str> = command[1..].iter().map(String::as_str).collect();
    if command[0] == "payments-jobs" {
        args.push("--once");
    }
    let (ok, _, stderr) = run_binary(&command[0], &args, &env).await;
    assert!(!ok, "started against a closed port?");
    stderr
}

#[tokio::test]
async fn the_api_and_the_jobs_accept_the_compose_configuration() {
    for name in ["api", "jobs"] {
        let stderr = start_with_compose_env(name, &[]).await;
        let opened = stderr.contains("opening postgres");
        let accepted = opened && !stderr.contains("invalid configuration");
        assert!(accepted, "{name} refuses compose's configuration: {stderr}");
        // The start-up check this file must pass: `sandbox` is not loopback,
        // so the sandbox's own key is refused there.
        let key = [("GATEWAY_SECRET_KEY", SANDBOX_SECRET_KEY)];
        let stderr = start_with_compose_env(name, &key).await;
        assert!(stderr.contains("refusing"), "{name}: {stderr}");
    }
    let secret = [("JWT_HS256_SECRET", DEV_JWT_SECRET)];
    let stderr = start_with_compose_env("api", &secret).await;
    assert!(stderr.contains("development"), "api: {stderr}");
}

// ---------------------------------------------------------------------------
// docker/compose.cluster.yaml.

/// The Galera topology: real binaries and variables; one migration run
/// against one node before anything serves; an API replica per node, each
/// on its own node's database, behind a balancer that checks `/readyz`; the
/// jobs on a node too; one provider and lease for all; Galera's required
/// settings; no development secret.
#[test]
fn the_cluster_compose_file_runs_a_replica_per_node_behind_readyz_checks() {
    let file = compose_file("docker/compose.cluster.yaml");
    let s = file["services"].as_object().cloned().expect("services");
    runs_only_real_binaries_with_real_flags_and_variables(&s);
    let command = |name| ours(&s)[name].join(" ");
    assert_eq!(command("migrate"), "payments-api migrate");
    let database = |name| Url::parse(env(&s[name], "DATABASE_URL")).unwrap();
    let (migrate, mut nodes) = (database("migrate"), BTreeSet::new());
    for name in ["api-1", "api-2", "jobs"] {
        let url = database(name);
        assert_eq!(url.scheme(), "mysql");
        let node = url.host_str().unwrap().to_owned();
        assert!(
            s[&node]["image"].as_str().unwrap().starts_with("mariadb:"),
            "{name}: {node}"
        );
        assert_eq!(
            (url.username(), url.password(), url.path()),
            (migrate.username(), migrate.password(), migrate.path()),
            "{name}: the same database"
        );
        let waits = &s[name]["depends_on"]["migrate"]["condition"];
        assert_eq!(
            waits, "service_completed_successfully",
            "{name} waits for migrate"
        );
        if name != "jobs" {
            assert!(nodes.insert(node), "{name}: a node of its own");
            assert_eq!(command(name), "payments-api");
        }
    }
    let lb = file["configs"]["haproxy"]["content"].as_str().unwrap();
    assert!(lb.contains("option httpchk GET /readyz"), "{lb}");
    for name in ["api-1", "api-2"] {
        let api_port = port(env(&s[name], "LISTEN_ADDR"));
        let check = s[name]["healthcheck"]["test"].to_string();
        assert!(
            check.contains(&format!(":{api_port}/readyz")),
            "{name}: {check}"
        );
        let server = format!("server {name} {name}:{api_port} check");
        assert!(lb.contains(&server), "the balancer sends to {name}: {lb}");
        for var in "GATEWAY_URL GATEWAY_SECRET_KEY LEASE GATEWAY_TIMEOUT".split(' ') {
            let [api, jobs] = [name, "jobs"].map(|n| &s[n]["environment"][var]);
            assert_eq!(api, jobs, "{var} differs between {name} and jobs");
        }
    }
    let galera = file["configs"]["galera"]["content"].as_str().unwrap();
    for setting in [
        "wsrep_on = ON",
        "binlog_format = ROW",
        "innodb_autoinc_lock_mode = 2",
    ] {
        assert!(galera.contains(setting), "{setting}: {galera}");
    }
    for (name, service) in &s {
        for secret in [SANDBOX_SECRET_KEY, DEV_JWT_SECRET] {
            assert!(
                !service.to_string().contains(secret),
                "{name} uses a development secret"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// docker/grafana-dashboard.json and docs/rollout.md.

/// The `payments_*` words of a text.
fn payments_words(text: &str) -> impl Iterator<Item = &str> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$';
    text.split(move |c| !word(c))
        .filter(|w| w.starts_with("payments_"))
}

/// The `payments_*` series a PromQL expression reads (quoted label values
/// skipped).
fn metric_names(expr: &str) -> BTreeSet<&str> {
    let unquoted = expr.split('"').step_by(2);
    unquoted.flat_map(payments_words).collect()
}

/// The recorded metric a series belongs to: a counter, a gauge, or a
/// histogram's `_bucket`, `_sum` or `_count`.
fn known_metric(series: &str) -> Option<&'static str> {
    let of_histogram = |h: &&str| {
        let suffix = series.strip_prefix(*h);
        suffix.is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
    };
    let single = COUNTERS.into_iter().chain(GAUGES).find(|c| *c == series);
    single.or_else(|| HISTOGRAMS.into_iter().find(of_histogram))
}

#[test]
fn the_dashboard_queries_exactly_the_exported_metrics() {
    let dashboard = read("docker/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&dashboard).expect("valid JSON");
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let prometheus = |v: &&Value| v["type"] == "datasource" && v["query"] == "prometheus";
    let datasource = variables.iter().find(prometheus);
    let datasource = datasource.expect("a datasource variable");
    let datasource = format!("${{{}}}", datasource["name"].as_str().unwrap());

    let (mut used, mut ids) = (BTreeSet::new(), BTreeSet::new());
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        let title = panel["title"].as_str().unwrap_or("?");
        let id = panel["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "duplicate panel id in {title}");
        assert!(panel["gridPos"].is_object(), "{title} has no gridPos");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let uid = &panel["datasource"]["uid"];
            assert_eq!(uid, &datasource, "{title} uses the datasource variable");
            let expr = target["expr"].as_str().expect("a PromQL expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title} queries no metric: {expr}");
            for name in names {
                let metric = known_metric(name);
                used.insert(metric.unwrap_or_else(|| panic!("{title} queries {name}")));
            }
        }
    }
    // Template variable queries read metrics too.
    for definition in variables.iter().filter_map(|v| v["definition"].as_str()) {
        for name in metric_names(definition) {
            assert!(known_metric(name).is_some(), "a variable queries {name}");
        }
    }
    let exported: BTreeSet<&str> = COUNTERS.into_iter().chain(HISTOGRAMS).collect();
    let missing: Vec<&&str> = exported.difference(&used).collect();
    assert!(missing.is_empty(), "no panel shows {missing:?}");
}

#[test]
fn the_rollout_guide_names_only_exported_metrics() {
    let text = read("docs/rollout.md");
    let names: BTreeSet<&str> = payments_words(&text).collect();
    assert!(names.contains("payments_keyless_requests_total"));
    for name in names {
        assert!(known_metric(name).is_some(), "docs/rollout.md names {name}");
    }
}

#[test]
fn every_metric_the_crates_name_is_listed() {
    let mut paths = vec![root().join("crates")];
    while let Some(path) = paths.pop() {
        if path.is_dir() {
            paths.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let quoted = text.split('"').skip(1).step_by(2);
        let suffix = |s: &str| s.ends_with("_total") || s.ends_with("_seconds");
        for name in quoted.filter(|s| s.starts_with("payments_") && suffix(s)) {
            // A gauge of an age or a duration ends in `_seconds` too.
            let listed =
                COUNTERS.contains(&name) || HISTOGRAMS.contains(&name) || GAUGES.contains(&name);
            assert!(
                listed,
                "{} names {name}: not in COUNTERS, HISTOGRAMS or GAUGES",
                path.display()
            );
        }
    }
}
