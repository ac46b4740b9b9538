//! The Docker files, checked without Docker (there is no engine on this
//! project's machines or CI): `docker/Dockerfile`, `docker/compose.yaml` and
//! `docker/grafana-dashboard.json` must agree with the workspace they ship.
//!
//! - Every binary the Dockerfile builds and copies, and every command compose
//!   runs, is a real `[[bin]]` of the workspace (`cargo metadata`), with real
//!   subcommands and flags (the built binary's `--help`).
//! - Every environment variable compose sets on a service of our image, and
//!   every `ENV` of the image, is one its binary reads (`[env: NAME` in its
//!   `--help`): a misspelt or invented variable would be silently ignored.
//! - The API and the jobs accept compose's configuration at start-up (the
//!   real binaries, run with compose's variables, get as far as opening the
//!   database), and would refuse the sandbox's key or the development secret
//!   there: `sandbox` is not a loopback host.
//! - `DATABASE_URL` matches the postgres service; the API and the jobs wait
//!   for the migrations; the health checks probe the right ports and paths.
//! - The dashboard parses and queries only the metrics the binaries export.
//!
//! Needs the binaries: `cargo build --workspace --bins` first (`make test` does).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use payments_api::config::DEV_JWT_SECRET;
use payments_jobs::settings::SANDBOX_SECRET_KEY;
use payments_tests::{binary, run_binary};
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

/// Variables the binaries read outside clap, so absent from `--help`:
/// `RUST_LOG` filters the logs (`payments_jobs::settings::init_logging`, the
/// sandbox's `main`).
const READ_OUTSIDE_CLAP: [&str; 1] = ["RUST_LOG"];

/// What the image must hold: the API, the jobs, the sandbox and the smoke test.
const SHIPPED: [&str; 4] = [
    "payments-api",
    "payments-jobs",
    "payments-sandbox",
    "payments-smoke",
];

/// The counters the binaries export (`crates/api/src/telemetry.rs`).
const COUNTERS: [&str; 9] = [
    "payments_http_requests_total",
    "payments_idempotent_replays_total",
    "payments_idempotency_conflicts_total",
    "payments_idempotency_key_reused_total",
    "payments_keyless_requests_total",
    "payments_provider_outcomes_total",
    "payments_lease_takeovers_total",
    "payments_reaper_records_total",
    "payments_pruned_records_total",
];

/// The histograms; a query reads them through `_bucket`, `_sum` or `_count`.
const HISTOGRAMS: [&str; 2] = [
    "payments_http_request_duration_seconds",
    "payments_provider_request_duration_seconds",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// The workspace, as cargo sees it.

#[derive(Debug)]
struct Workspace {
    /// Member directories relative to the root, e.g. `crates/api`.
    members: BTreeSet<String>,
    /// Binary name -> the package that declares it.
    bins: BTreeMap<String, String>,
}

fn workspace() -> Workspace {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let root = root();
    let mut members = BTreeSet::new();
    let mut bins = BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        let dir = manifest.parent().unwrap().strip_prefix(&root).unwrap();
        members.insert(dir.to_str().unwrap().to_owned());
        for target in package["targets"].as_array().unwrap() {
            if target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "bin")
            {
                bins.insert(target["name"].as_str().unwrap().to_owned(), name.to_owned());
            }
        }
    }
    Workspace { members, bins }
}

/// The built binary's `--help` for `argv`'s binary and subcommands (its
/// leading words). Panics if the binary or a subcommand does not exist.
fn help(argv: &[String]) -> String {
    let words: Vec<&String> = argv.iter().take_while(|w| !w.starts_with('-')).collect();
    let (name, subcommands) = words.split_first().expect("a command");
    let output = Command::new(binary(name))
        .args(subcommands)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{} --help` failed (no such subcommand?): {}",
        words
            .iter()
            .map(|w| w.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// The environment variables a `--help` text lists (`[env: NAME]` or
/// `[env: NAME=value]`).
fn env_vars_in_help(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

// ---------------------------------------------------------------------------
// docker/Dockerfile, as a list of stages of instructions.

#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

impl Instruction {
    fn words(&self) -> Vec<&str> {
        self.args.split_whitespace().collect()
    }
}

#[derive(Debug)]
struct Stage {
    /// The base image with the global `ARG` defaults substituted.
    base: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all(&self, keyword: &str) -> impl Iterator<Item = &Instruction> {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
    }
}

/// Joins continuation lines, drops comments (and parser directives), and
/// splits the file into stages.
fn dockerfile() -> Vec<Stage> {
    let text = read("docker/Dockerfile");
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(
        current.is_empty(),
        "the Dockerfile ends inside a continuation"
    );

    let mut global_args = BTreeMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_owned(),
        };
        match (instruction.keyword.as_str(), stages.last_mut()) {
            ("ARG", None) => {
                let (name, default) = instruction
                    .args
                    .split_once('=')
                    .unwrap_or((&instruction.args, ""));
                global_args.insert(name.to_owned(), default.to_owned());
            }
            ("FROM", _) => {
                let words = instruction.words();
                let mut base = words[0].to_owned();
                for (name, value) in &global_args {
                    base = base.replace(&format!("${{{name}}}"), value);
                }
                let name = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                    _ => None,
                };
                stages.push(Stage {
                    base,
                    name,
                    instructions: Vec::new(),
                });
            }
            (_, Some(stage)) => stage.instructions.push(instruction),
            (keyword, None) => panic!("{keyword} before the first FROM"),
        }
    }
    stages
}

/// The `cargo build` commands of a `RUN`, each as its words.
fn cargo_builds(run: &Instruction) -> Vec<Vec<&str>> {
    run.args
        .split("&&")
        .map(|command| command.split_whitespace().collect::<Vec<_>>())
        .filter(|words| words.starts_with(&["cargo", "build"]))
        .collect()
}

/// The values of `flag` in `words`, as `flag value` or `flag=value`.
fn flag_values<'a>(words: &[&'a str], flag: &str) -> Vec<&'a str> {
    let mut values = Vec::new();
    let mut words = words.iter();
    while let Some(word) = words.next() {
        if *word == flag {
            values.extend(words.next().copied());
        } else if let Some(value) = word.strip_prefix(flag).and_then(|w| w.strip_prefix('=')) {
            values.push(value);
        }
    }
    values
}

/// The exec-form `CMD` of the final stage.
fn image_cmd(stages: &[Stage]) -> Vec<String> {
    let cmd = stages.last().unwrap().all("CMD").last().expect("a CMD");
    serde_json::from_str(&cmd.args).expect("CMD in exec form: [\"payments-api\"]")
}

/// `COPY` sources (without flags), its destination, and its `--from`.
fn copy_parts(copy: &Instruction) -> (Vec<&str>, &str, Option<&str>) {
    let words = copy.words();
    let from = flag_values(&words, "--from").first().copied();
    let mut paths: Vec<&str> = words.into_iter().filter(|w| !w.starts_with("--")).collect();
    let destination = paths.pop().expect("a COPY destination");
    (paths, destination, from)
}

#[test]
fn the_dockerfile_builds_and_ships_exactly_the_four_binaries() {
    let workspace = workspace();
    let stages = dockerfile();
    let builder = stages.first().unwrap();
    assert!(
        builder.base.starts_with("rust:"),
        "the builder is the official rust image, not {}",
        builder.base
    );
    let builder_name = builder.name.as_deref().expect("the builder stage is named");

    let builds: Vec<Vec<&str>> = builder.all("RUN").flat_map(cargo_builds).collect();
    assert!(!builds.is_empty(), "no cargo build in the builder stage");
    for build in &builds {
        assert!(
            build.contains(&"--release") && build.contains(&"--locked"),
            "every build is `--release --locked`: {}",
            build.join(" ")
        );
    }
    let built: BTreeSet<&str> = builds
        .iter()
        .flat_map(|b| flag_values(b, "--bin"))
        .collect();
    assert_eq!(built, BTreeSet::from(SHIPPED), "binaries built (--bin)");
    for build in builds
        .iter()
        .filter(|b| !flag_values(b, "--bin").is_empty())
    {
        let packages: BTreeSet<&str> = flag_values(build, "-p").into_iter().collect();
        for bin in flag_values(build, "--bin") {
            let package = workspace
                .bins
                .get(bin)
                .unwrap_or_else(|| panic!("{bin} is not a [[bin]] of the workspace"));
            assert!(
                packages.is_empty() || packages.contains(package.as_str()),
                "{bin} is in {package}, which the build does not select with -p"
            );
        }
    }
    // The dependency layer builds the same packages, so its artifacts are reused.
    let package_sets: BTreeSet<BTreeSet<&str>> = builds
        .iter()
        .map(|b| flag_values(b, "-p").into_iter().collect())
        .collect();
    assert_eq!(
        package_sets.len(),
        1,
        "every cargo build selects the same -p packages"
    );

    // The final stage copies exactly what was built, from the builder's release dir.
    let runtime = stages.last().unwrap();
    let mut copied = BTreeSet::new();
    for copy in runtime.all("COPY") {
        let (sources, destination, from) = copy_parts(copy);
        if from != Some(builder_name) {
            continue;
        }
        assert_eq!(destination, "/usr/local/bin/", "binaries go on the PATH");
        for source in sources {
            assert!(
                source.contains("/target/release/"),
                "{source} is not a release artifact"
            );
            copied.insert(source.rsplit('/').next().unwrap());
        }
    }
    assert_eq!(
        copied,
        BTreeSet::from(SHIPPED),
        "binaries copied into the image"
    );
}

#[test]
fn the_dependency_layer_lists_every_workspace_member() {
    let workspace = workspace();
    let stages = dockerfile();
    let builder = stages.first().unwrap();
    let copied: BTreeSet<String> = builder
        .all("COPY")
        .flat_map(|copy| copy_parts(copy).0)
        .map(|source| source.trim_start_matches("./").to_owned())
        .collect();
    for file in ["Cargo.toml", "Cargo.lock"] {
        assert!(copied.contains(file), "the builder copies {file}");
    }
    for member in &workspace.members {
        let manifest = format!("{member}/Cargo.toml");
        assert!(
            copied.contains(&manifest),
            "docker/Dockerfile does not copy {manifest}: cargo cannot load the workspace in \
             the dependency layer"
        );
    }
    // sqlx::migrate! compiles the migrations into the binaries.
    let position =
        |pred: &dyn Fn(&Instruction) -> bool| builder.instructions.iter().position(pred).unwrap();
    let migrations = position(&|i| i.keyword == "COPY" && copy_parts(i).0.contains(&"migrations"));
    let final_build =
        position(&|i| i.keyword == "RUN" && cargo_builds(i).iter().any(|b| b.contains(&"--bin")));
    assert!(
        migrations < final_build,
        "the migrations are copied before the build"
    );
}

#[test]
fn the_runtime_image_is_small_non_root_and_serves_the_api() {
    let stages = dockerfile();
    let runtime = stages.last().unwrap();
    assert!(
        (runtime.base.starts_with("debian:") && runtime.base.ends_with("-slim"))
            || runtime.base.contains("distroless"),
        "a small runtime base, not {}",
        runtime.base
    );
    let user = runtime.all("USER").last().expect("a USER").args.clone();
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as root: USER {user}");
    assert!(runtime.all("WORKDIR").next().is_some(), "a WORKDIR");
    assert!(
        runtime.all("EXPOSE").any(|e| e.words().contains(&"8080")),
        "EXPOSE 8080"
    );
    let cmd = image_cmd(&stages);
    assert_eq!(cmd, ["payments-api"], "the default command serves the API");

    // Every ENV of the image is read by its default binary.
    let read = env_vars_in_help(&help(&cmd));
    for env in runtime.all("ENV") {
        let (name, _) = env.args.split_once(['=', ' ']).expect("ENV NAME=value");
        assert!(
            read.contains(name),
            "the image sets {name}, which payments-api does not read"
        );
    }
}

// ---------------------------------------------------------------------------
// docker/compose.yaml.

#[derive(Debug)]
struct Service {
    /// Built from docker/Dockerfile: runs one of our binaries.
    ours: bool,
    /// The command, or the image's default for our image.
    command: Vec<String>,
    environment: BTreeMap<String, String>,
    /// Service -> condition.
    depends_on: BTreeMap<String, String>,
    healthcheck: Vec<String>,
    ports: Vec<String>,
}

impl Service {
    fn env(&self, name: &str) -> &str {
        self.environment
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not set"))
    }
}

fn scalar(yaml: &Yaml) -> Option<String> {
    match yaml {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        Yaml::Null => Some(String::new()),
        _ => None,
    }
}

fn strings(yaml: &Yaml) -> Vec<String> {
    match yaml {
        Yaml::Array(items) => items.iter().map(|i| scalar(i).unwrap()).collect(),
        Yaml::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        Yaml::BadValue => Vec::new(),
        other => panic!("expected a list or a string, got {other:?}"),
    }
}

fn compose() -> BTreeMap<String, Service> {
    let docs = YamlLoader::load_from_str(&read("docker/compose.yaml")).expect("valid YAML");
    let doc = docs.first().expect("one document");
    let default_cmd = image_cmd(&dockerfile());
    let compose_dir = root().join("docker");
    let dockerfile_path = compose_dir.join("Dockerfile").canonicalize().unwrap();
    let mut services = BTreeMap::new();
    for (name, spec) in doc["services"].as_hash().expect("services") {
        let name = name.as_str().unwrap().to_owned();
        let build = &spec["build"];
        let ours = match build {
            Yaml::BadValue => false,
            _ => {
                let context = compose_dir.join(build["context"].as_str().expect("build.context"));
                let file = context.join(build["dockerfile"].as_str().unwrap_or("Dockerfile"));
                assert_eq!(
                    file.canonicalize().unwrap(),
                    dockerfile_path,
                    "{name} builds another Dockerfile"
                );
                true
            }
        };
        let mut command = strings(&spec["command"]);
        if command.is_empty() && ours {
            command.clone_from(&default_cmd);
        }
        let environment = match &spec["environment"] {
            Yaml::Hash(map) => map
                .iter()
                .map(|(k, v)| (scalar(k).unwrap(), scalar(v).expect("a scalar value")))
                .collect(),
            Yaml::Array(items) => items
                .iter()
                .map(|item| {
                    let item = item.as_str().unwrap();
                    let (k, v) = item.split_once('=').unwrap_or((item, ""));
                    (k.to_owned(), v.to_owned())
                })
                .collect(),
            Yaml::BadValue => BTreeMap::new(),
            other => panic!("{name}: unexpected environment {other:?}"),
        };
        let depends_on = match &spec["depends_on"] {
            Yaml::Hash(map) => map
                .iter()
                .map(|(k, v)| {
                    let condition = v["condition"].as_str().unwrap_or("service_started");
                    (k.as_str().unwrap().to_owned(), condition.to_owned())
                })
                .collect(),
            other => strings(other)
                .into_iter()
                .map(|s| (s, "service_started".to_owned()))
                .collect(),
        };
        services.insert(
            name,
            Service {
                ours,
                command,
                environment,
                depends_on,
                healthcheck: strings(&spec["healthcheck"]["test"]),
                ports: strings(&spec["ports"]),
            },
        );
    }
    services
}

/// `scheme://user:password@host:port/database`, split.
#[derive(Debug, PartialEq, Eq)]
struct DbUrl {
    scheme: String,
    user: String,
    password: String,
    host: String,
    port: String,
    database: String,
}

fn parse_db_url(url: &str) -> DbUrl {
    let (scheme, rest) = url.split_once("://").expect("scheme://");
    let (userinfo, rest) = rest.rsplit_once('@').expect("user:password@");
    let (user, password) = userinfo.split_once(':').expect("user:password");
    let (authority, database) = rest.split_once('/').expect("/database");
    let (host, port) = authority.split_once(':').unwrap_or((authority, "5432"));
    DbUrl {
        scheme: scheme.to_owned(),
        user: user.to_owned(),
        password: password.to_owned(),
        host: host.to_owned(),
        port: port.to_owned(),
        database: database.split('?').next().unwrap().to_owned(),
    }
}

/// `http://host:port/...` -> (host, port).
fn host_port(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap();
    let (host, port) = authority.rsplit_once(':').expect("host:port");
    (host.to_owned(), port.to_owned())
}

#[test]
fn compose_runs_only_real_binaries_subcommands_and_flags() {
    let workspace = workspace();
    let services = compose();
    for name in ["postgres", "sandbox", "migrate", "api", "jobs"] {
        assert!(services.contains_key(name), "compose has no {name} service");
    }
    for (name, service) in services.iter().filter(|(_, s)| s.ours) {
        let program = &service.command[0];
        assert!(
            workspace.bins.contains_key(program),
            "{name} runs {program}, which is not a [[bin]] of the workspace"
        );
        assert!(
            SHIPPED.contains(&program.as_str()),
            "{name} runs {program}, which the image does not hold"
        );
        let help = help(&service.command);
        for flag in service.command.iter().filter(|w| w.starts_with("--")) {
            let flag = flag.split('=').next().unwrap();
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{name}: {program} has no {flag}"
            );
        }
    }
    let command = |name: &str| services[name].command.join(" ");
    assert_eq!(command("migrate"), "payments-api migrate");
    assert_eq!(command("api"), "payments-api");
    assert_eq!(command("jobs"), "payments-jobs run");
    assert!(command("sandbox").starts_with("payments-sandbox --listen 0.0.0.0:"));
}

#[test]
fn compose_sets_only_variables_the_binaries_read() {
    for (name, service) in compose().iter().filter(|(_, s)| s.ours) {
        let read = env_vars_in_help(&help(&service.command));
        assert!(!read.is_empty(), "{name}: no [env: ...] in --help");
        let unread: Vec<&String> = service
            .environment
            .keys()
            .filter(|k| !read.contains(*k) && !READ_OUTSIDE_CLAP.contains(&k.as_str()))
            .collect();
        assert!(
            unread.is_empty(),
            "{name} sets {unread:?}, which `{}` does not read (it reads {read:?})",
            service.command.join(" ")
        );
    }
}

#[test]
fn the_database_url_matches_the_postgres_service() {
    let services = compose();
    let postgres = &services["postgres"];
    let url = services["api"].env("DATABASE_URL");
    for name in ["migrate", "jobs"] {
        assert_eq!(
            services[name].env("DATABASE_URL"),
            url,
            "{name} and api share one database"
        );
    }
    let url = parse_db_url(url);
    assert!(["postgres", "postgresql"].contains(&url.scheme.as_str()));
    assert_eq!(url.host, "postgres", "the host is the postgres service");
    assert_eq!(url.port, "5432");
    assert_eq!(url.user, postgres.env("POSTGRES_USER"));
    assert_eq!(url.password, postgres.env("POSTGRES_PASSWORD"));
    assert_eq!(url.database, postgres.env("POSTGRES_DB"));
}

#[test]
fn the_api_and_the_jobs_wait_for_the_migrations_and_health_checks_probe_the_right_ports() {
    let services = compose();
    for name in ["api", "jobs"] {
        let depends = &services[name].depends_on;
        assert_eq!(
            depends.get("migrate").map(String::as_str),
            Some("service_completed_successfully"),
            "{name} starts only once the migrations succeeded"
        );
        assert_eq!(
            depends.get("postgres").map(String::as_str),
            Some("service_healthy")
        );
        assert_eq!(
            depends.get("sandbox").map(String::as_str),
            Some("service_healthy")
        );
    }
    assert_eq!(
        services["migrate"]
            .depends_on
            .get("postgres")
            .map(String::as_str),
        Some("service_healthy")
    );

    let postgres = services["postgres"].healthcheck.join(" ");
    assert!(
        postgres.contains("pg_isready"),
        "postgres health check: {postgres}"
    );

    let sandbox = &services["sandbox"];
    let listen = flag_values(
        &sandbox
            .command
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "--listen",
    )[0]
    .to_owned();
    let (_, sandbox_port) = host_port(&listen);
    let check = sandbox.healthcheck.join(" ");
    assert!(
        check.contains(&format!(":{sandbox_port}/healthz")),
        "the sandbox health check probes /healthz on {sandbox_port}: {check}"
    );

    let api = &services["api"];
    let (_, api_port) = host_port(api.env("LISTEN_ADDR"));
    let check = api.healthcheck.join(" ");
    assert!(
        check.contains(&format!(":{api_port}/readyz")),
        "the api health check probes /readyz on {api_port}: {check}"
    );
    assert!(
        api.ports
            .iter()
            .any(|p| p.ends_with(&format!(":{api_port}"))),
        "the api publishes its port {api_port}: {:?}",
        api.ports
    );
    for name in ["api", "jobs"] {
        let (host, port) = host_port(services[name].env("GATEWAY_URL"));
        assert_eq!(
            (host.as_str(), port.as_str()),
            ("sandbox", sandbox_port.as_str()),
            "{name} calls the sandbox service where it listens"
        );
    }
    for var in ["GATEWAY_URL", "GATEWAY_SECRET_KEY"] {
        assert_eq!(services["api"].env(var), services["jobs"].env(var), "{var}");
    }
    // Lease and timeout must agree between everything that drives a charge.
    for var in ["LEASE", "GATEWAY_TIMEOUT"] {
        assert_eq!(
            services["api"].environment.get(var),
            services["jobs"].environment.get(var),
            "{var} differs between api and jobs"
        );
    }
}

#[test]
fn no_service_uses_the_sandbox_key_or_the_development_secret() {
    for (name, service) in compose() {
        let values = service.environment.values().chain(service.command.iter());
        for value in values {
            assert!(
                !value.contains(SANDBOX_SECRET_KEY) && !value.contains(DEV_JWT_SECRET),
                "{name} uses a development secret: {value}"
            );
        }
    }
    let services = compose();
    let secret = services["api"].env("JWT_HS256_SECRET");
    assert!(secret.len() >= 32, "JWT_HS256_SECRET is at least 32 bytes");
}

/// Runs a compose service's command with its environment, its database
/// moved to a closed local port: a configuration the binary accepts gets as
/// far as opening the database, one it refuses stops before.
async fn start_with_compose_env(service: &Service, overrides: &[(&str, &str)]) -> String {
    let mut env = service.environment.clone();
    let db = parse_db_url(service.env("DATABASE_URL"));
    env.insert(
        "DATABASE_URL".into(),
        format!(
            "{}://{}:{}@127.0.0.1:1/{}",
            db.scheme, db.user, db.password, db.database
        ),
    );
    env.insert("DATABASE_ACQUIRE_TIMEOUT".into(), "500ms".into());
    for (k, v) in overrides {
        env.insert((*k).into(), (*v).into());
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut args: Vec<&str> = service.command[1..].iter().map(String::as_str).collect();
    if service.command[0] == "payments-jobs" {
        args.push("--once");
    }
    let (ok, _, stderr) = run_binary(&service.command[0], &args, &env).await;
    assert!(!ok, "started against a closed port?");
    stderr
}

#[tokio::test]
async fn the_api_and_the_jobs_accept_the_compose_configuration() {
    let services = compose();
    for name in ["api", "jobs"] {
        let stderr = start_with_compose_env(&services[name], &[]).await;
        assert!(
            stderr.contains("opening postgres") && !stderr.contains("invalid configuration"),
            "{name} refuses compose's configuration: {stderr}"
        );
        // The start-up check this file must pass: `sandbox` is not loopback,
        // so the sandbox's own key is refused there.
        let stderr = start_with_compose_env(
            &services[name],
            &[("GATEWAY_SECRET_KEY", SANDBOX_SECRET_KEY)],
        )
        .await;
        assert!(stderr.contains("refusing"), "{name}: {stderr}");
    }
    let stderr =
        start_with_compose_env(&services["api"], &[("JWT_HS256_SECRET", DEV_JWT_SECRET)]).await;
    assert!(stderr.contains("development"), "api: {stderr}");
}

// ---------------------------------------------------------------------------
// docker/grafana-dashboard.json.

/// The `payments_*` words of a text.
fn payments_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$'))
        .filter(|w| w.starts_with("payments_"))
        .map(str::to_owned)
        .collect()
}

/// The `payments_*` series a PromQL expression reads (quoted label values
/// skipped).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut unquoted = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        if c == '"' {
            quoted = !quoted;
        } else if !quoted {
            unquoted.push(c);
        }
    }
    payments_words(&unquoted)
}

/// The exported metric a series name belongs to, if any.
fn known_metric(series: &str) -> Option<&'static str> {
    if let Some(counter) = COUNTERS.iter().find(|c| **c == series) {
        return Some(counter);
    }
    HISTOGRAMS.iter().copied().find(|h| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| series.strip_suffix(suffix) == Some(h))
    })
}

fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        all.push(panel);
    }
    all
}

#[test]
fn the_dashboard_queries_exactly_the_exported_metrics() {
    let dashboard: Value =
        serde_json::from_str(&read("docker/grafana-dashboard.json")).expect("valid JSON");
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .expect("a Prometheus datasource variable");
    let datasource_ref = format!("${{{}}}", datasource["name"].as_str().unwrap());

    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a panel id")),
            "duplicate panel id in {title}"
        );
        assert!(panel["gridPos"].is_object(), "{title} has no gridPos");
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        assert_eq!(
            panel["datasource"]["uid"], datasource_ref,
            "{title} uses the datasource variable"
        );
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{title} queries no payments metric: {expr}"
            );
            for name in names {
                let metric = known_metric(&name)
                    .unwrap_or_else(|| panic!("{title} queries {name}, which is not exported"));
                used.insert(metric);
            }
        }
    }
    // Template variable queries read metrics too.
    for variable in variables {
        if let Some(definition) = variable["definition"].as_str() {
            for name in metric_names(definition) {
                assert!(known_metric(&name).is_some(), "variable queries {name}");
            }
        }
    }
    let exported: BTreeSet<&str> = COUNTERS.iter().chain(HISTOGRAMS.iter()).copied().collect();
    let missing: Vec<&&str> = exported.difference(&used).collect();
    assert!(missing.is_empty(), "no panel shows {missing:?}");
}

#[test]
fn the_rollout_guide_names_only_exported_metrics() {
    let text = read("docs/rollout.md");
    let names = payments_words(&text);
    assert!(names.contains("payments_keyless_requests_total"));
    for name in names {
        assert!(
            known_metric(&name).is_some(),
            "docs/rollout.md names {name}"
        );
    }
}
