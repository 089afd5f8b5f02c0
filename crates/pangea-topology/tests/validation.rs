//! Every kind of problem in a topology or placement file is reported with its file,
//! line and key — all of them at once.

use pangea_topology::{
    Access, Deployment, Placement, ProblemKind, Problems, Routing, ScopeId, Topology,
};
use std::path::Path;

/// A valid topology: 2 continents, 3 regions, 6 replicas.
const BASE: &str = r#"name = "t"
intra_region_rtt_ms = 1.0

[[continents]]
name = "na"

  [[continents.regions]]
  name = "us-east-1"

    [[continents.regions.replicas]]
    id = "use1-a"
    role = "serving"

    [[continents.regions.replicas]]
    id = "use1-b"
    role = "batch"

    [[continents.regions.replicas]]
    id = "use1-relay"
    role = "relay"

[[continents]]
name = "eu"

  [[continents.regions]]
  name = "eu-west-1"

    [[continents.regions.replicas]]
    id = "euw1-a"
    role = "serving"

  [[continents.regions]]
  name = "eu-central-1"

    [[continents.regions.replicas]]
    id = "euc1-a"
    role = "serving"

    [[continents.regions.replicas]]
    id = "euc1-b"
    role = "serving"

[[links]]
a = "us-east-1"
b = "eu-west-1"
rtt_ms = 70.0

[[links]]
a = "eu-west-1"
b = "eu-central-1"
rtt_ms = 27.0

[[app_profiles]]
name = "frontend"
routing = "nearest"
tables = { ad_profiles = "read-write" }

[[app_profiles]]
name = "batch"
routing = "pinned"
replicas = ["use1-b"]
priority = "batch"
tables = { ad_profiles = "read" }
"#;

fn topo(text: &str) -> Result<Topology, Problems> {
    Topology::parse(Path::new("topo.toml"), text)
}

fn problems(text: &str) -> Problems {
    topo(text).expect_err("expected problems")
}

/// Finds the 1-based line of the first occurrence of `needle` after line `after`.
fn line_of(text: &str, needle: &str, after: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(after)
        .find(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .unwrap()
}

#[test]
fn base_is_valid() {
    let t = topo(BASE).unwrap();
    assert_eq!(t.replicas.len(), 6);
    assert_eq!(
        t.rtt_ms(&"use1-a".into(), &"euc1-a".into()),
        Some(97.0),
        "two hops: 70 + 27"
    );
    assert_eq!(t.rtt_ms(&"euc1-a".into(), &"euc1-b".into()), Some(1.0));
}

#[test]
fn unknown_region_and_replica_references() {
    let text = BASE
        .replace(
            "b = \"eu-west-1\"\nrtt_ms = 70.0",
            "b = \"eu-west-9\"\nrtt_ms = 70.0",
        )
        .replace("replicas = [\"use1-b\"]", "replicas = [\"nobody\"]");
    let p = problems(&text);
    let unknown: Vec<_> =
        p.0.iter()
            .filter(|p| p.kind == ProblemKind::UnknownReference)
            .collect();
    assert_eq!(unknown.len(), 2, "{p}");
    assert_eq!(unknown[0].key, "links[0].b");
    assert_eq!(unknown[0].line, Some(line_of(&text, "eu-west-9", 0)));
    assert!(unknown[0].message.contains("eu-west-9"));
    assert_eq!(unknown[1].key, "app_profiles[1].replicas[0]");
    assert_eq!(unknown[1].line, Some(line_of(&text, "nobody", 0)));
}

#[test]
fn duplicate_ids() {
    let text = BASE.replace("id = \"euc1-b\"", "id = \"euc1-a\"");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::Duplicate]);
    assert_eq!(p.0[0].key, "continents[1].regions[1].replicas[1].id");
    // The second `euc1-a`.
    let first = line_of(&text, "id = \"euc1-a\"", 0);
    assert_eq!(p.0[0].line, Some(line_of(&text, "id = \"euc1-a\"", first)));
    assert!(p.to_string().starts_with("1 problem:\n  topo.toml:"), "{p}");
}

#[test]
fn self_link() {
    let text = BASE.replace(
        "a = \"eu-west-1\"\nb = \"eu-central-1\"",
        "a = \"eu-west-1\"\nb = \"eu-west-1\"",
    );
    let p = problems(&text);
    assert!(p.kinds().contains(&ProblemKind::SelfLink), "{p}");
    let sl =
        p.0.iter()
            .find(|p| p.kind == ProblemKind::SelfLink)
            .unwrap();
    assert_eq!(sl.key, "links[1].b");
    // Without that link eu-central-1 is cut off, which is reported too.
    assert!(p.kinds().contains(&ProblemKind::Disconnected), "{p}");
}

#[test]
fn region_without_serving_replica() {
    let text = BASE.replace(
        "id = \"euw1-a\"\n    role = \"serving\"",
        "id = \"euw1-a\"\n    role = \"batch\"",
    );
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::NoServingReplica]);
    assert_eq!(p.0[0].key, "continents[1].regions[0].name");
    assert_eq!(p.0[0].line, Some(line_of(&text, "name = \"eu-west-1\"", 0)));
}

#[test]
fn disconnected_graph() {
    let text = BASE.replace(
        "[[links]]\na = \"us-east-1\"\nb = \"eu-west-1\"\nrtt_ms = 70.0\n",
        "",
    );
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::Disconnected]);
    assert!(p.0[0].message.contains("{us-east-1}"), "{}", p.0[0].message);
}

#[test]
fn negative_and_missing_latencies() {
    let text = BASE.replace("rtt_ms = 27.0", "rtt_ms = -3.0");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidValue]);
    assert_eq!(p.0[0].key, "links[1].rtt_ms");
    assert_eq!(p.0[0].line, Some(line_of(&text, "rtt_ms = -3.0", 0)));
    assert!(p.0[0].message.contains("-3"));

    let text = BASE.replace("rtt_ms = 27.0\n", "");
    let p = problems(&text);
    assert!(p.kinds().contains(&ProblemKind::MissingField), "{p}");
    assert!(
        p.0.iter()
            .any(|x| x.key == "links[1]" && x.message.contains("rtt_ms")),
        "{p}"
    );
}

#[test]
fn unknown_field() {
    let text = BASE.replace(
        "role = \"relay\"",
        "role = \"relay\"\n    colour = \"blue\"",
    );
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::UnknownField]);
    assert_eq!(p.0[0].key, "continents[0].regions[0].replicas[2].colour");
    assert_eq!(p.0[0].line, Some(line_of(&text, "colour", 0)));
}

#[test]
fn pinned_profile_naming_a_relay() {
    let text = BASE.replace(
        "replicas = [\"use1-b\"]",
        "replicas = [\"use1-b\", \"use1-relay\"]",
    );
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::PinnedRelay]);
    assert_eq!(p.0[0].key, "app_profiles[1].replicas[1]");
}

#[test]
fn syntax_error_has_a_line() {
    let p = problems("name = \"t\"\nintra_region_rtt_ms = = 1\n");
    assert_eq!(p.kinds(), vec![ProblemKind::Syntax]);
    assert_eq!(p.0[0].line, Some(2));
}

#[test]
fn many_problems_are_reported_at_once() {
    let text = BASE
        .replace("rtt_ms = 27.0", "rtt_ms = -1.0")
        .replace("id = \"euc1-b\"", "id = \"euc1-a\"")
        .replace("replicas = [\"use1-b\"]", "replicas = [\"use1-relay\"]")
        .replace("routing = \"nearest\"", "routing = \"closest\"");
    let p = problems(&text);
    // The link with a negative latency still joins its regions: one problem, not two.
    assert_eq!(
        p.kinds(),
        vec![
            ProblemKind::Duplicate,
            ProblemKind::InvalidValue,
            ProblemKind::InvalidValue,
            ProblemKind::PinnedRelay
        ],
        "{p}"
    );
    // In file order.
    let lines: Vec<_> = p.0.iter().map(|p| p.line.unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{lines:?}");
}

const PLACEMENT: &str = r#"[[tables]]
name = "ad_profiles"

  [[tables.families]]
  name = "profile"
  max_versions = 1

[[policies]]
name = "eu-resident"
regions = ["eu-west-1", "eu-central-1"]

[[rules]]
table = "ad_profiles"
prefix = "eu/"
policy = "eu-resident"

[[home_rules]]
table = "ad_profiles"
prefix = "eu/"
home = "eu-central-1"
"#;

fn placement(text: &str) -> Result<Placement, Problems> {
    Placement::parse(Path::new("place.toml"), text, &topo(BASE).unwrap())
}

#[test]
fn placement_routes_rows_by_prefix() {
    let p = placement(PLACEMENT).unwrap();
    assert_eq!(p.policy_of("ad_profiles", b"eu/42").as_str(), "eu-resident");
    assert_eq!(p.policy_of("ad_profiles", b"us/42").as_str(), "global");
    assert_eq!(
        p.home_of("ad_profiles", b"eu/42").map(|r| r.as_str()),
        Some("eu-central-1")
    );
    assert_eq!(
        p.schema
            .table("ad_profiles")
            .unwrap()
            .family("profile")
            .unwrap()
            .max_versions,
        Some(1)
    );
}

#[test]
fn placement_problems() {
    // A policy naming an unknown region, a rule naming an unknown table, a home outside
    // its policy, a bad TTL.
    let text = PLACEMENT
        .replace(
            "regions = [\"eu-west-1\", \"eu-central-1\"]",
            "regions = [\"eu-west-1\", \"eu-south-7\"]",
        )
        .replace("home = \"eu-central-1\"", "home = \"us-east-1\"")
        .replace("max_versions = 1", "max_versions = 1\n  ttl = \"soon\"");
    let p = placement(&text).unwrap_err();
    let kinds = p.kinds();
    assert!(kinds.contains(&ProblemKind::UnknownReference), "{p}");
    assert!(
        p.0.iter()
            .any(|x| x.key == "tables[0].families[0].ttl" && x.message.contains("soon")),
        "{p}"
    );
    assert!(
        p.0.iter()
            .any(|x| x.key == "home_rules[0].home" && x.message.contains("outside policy")),
        "{p}"
    );
    assert!(
        p.0.iter()
            .all(|x| x.file == Path::new("place.toml") && x.line.is_some()),
        "{p}"
    );
}

#[test]
fn change_stream_retention() {
    // A table with a change stream: every table's log is kept its retention.
    let text = PLACEMENT.replace(
        "name = \"ad_profiles\"\n",
        "name = \"ad_profiles\"\nchanges = { retention = \"24h\" }\n",
    );
    let p = placement(&text).unwrap();
    let table = p.schema.table("ad_profiles").unwrap();
    assert_eq!(table.change_retention_ms, Some(86_400_000));
    assert_eq!(p.schema.change_retention_ms(), Some(86_400_000));
    assert_eq!(
        placement(PLACEMENT).unwrap().schema.change_retention_ms(),
        None
    );
    // Out of 1 s ..= 30 d, or not a duration: named by file, line and key.
    for bad in ["\"31d\"", "\"0s\"", "\"a while\""] {
        let text = text.replace("\"24h\"", bad);
        let p = placement(&text).unwrap_err();
        assert!(
            p.0.iter().any(|x| x.key == "tables[0].changes.retention"
                && x.line == Some(3)
                && x.message.contains("of 1s to 30d")),
            "{p}"
        );
    }
}

#[test]
fn counter_families() {
    // A counter family, declared by `type`; with a TTL it forgets old increments.
    let text = PLACEMENT.replace(
        "max_versions = 1\n",
        "max_versions = 1\n\n  [[tables.families]]\n  name = \"caps\"\n  type = \"counter\"\n  ttl = \"24h\"\n",
    );
    let p = placement(&text).unwrap();
    let table = p.schema.table("ad_profiles").unwrap();
    assert!(table.family("caps").unwrap().is_counter());
    assert!(!table.family("profile").unwrap().is_counter());
    assert!(table.has_counters());
    // An unknown type, and max_versions on a counter, are named by file, line and key.
    let bad = text
        .replace(
            "type = \"counter\"",
            "type = \"counter\"\n  max_versions = 2",
        )
        .replace("name = \"profile\"", "name = \"profile\"\n  type = \"sum\"");
    let p = placement(&bad).unwrap_err();
    assert!(
        p.0.iter()
            .any(|x| x.key == "tables[0].families[1].max_versions"
                && x.message.contains("counter")
                && x.line == Some(12)),
        "{p}"
    );
    assert!(
        p.0.iter()
            .any(|x| x.key == "tables[0].families[0].type" && x.message.contains("\"sum\"")),
        "{p}"
    );
}

#[test]
fn event_time_windows() {
    use pangea_topology::schema::EventTimeWindow;
    // Without `event_time`, writes take the replica's clock only.
    let p = placement(PLACEMENT).unwrap();
    assert_eq!(p.schema.table("ad_profiles").unwrap().event_time, None);
    let text = PLACEMENT.replace(
        "name = \"ad_profiles\"\n",
        "name = \"ad_profiles\"\nevent_time = { past = \"90d\" }\n",
    );
    let p = placement(&text).unwrap();
    assert_eq!(
        p.schema.table("ad_profiles").unwrap().event_time,
        Some(EventTimeWindow {
            past_ms: 90 * 86_400_000,
            future_ms: EventTimeWindow::FUTURE_DEFAULT_MS,
        })
    );
    // A bad past and a future beyond an hour are named by key and line.
    let bad = PLACEMENT.replace(
        "name = \"ad_profiles\"\n",
        "name = \"ad_profiles\"\nevent_time = { past = \"ninety\", future = \"2h\" }\n",
    );
    let p = placement(&bad).unwrap_err();
    for (key, needle) in [
        ("tables[0].event_time.past", "\"ninety\""),
        ("tables[0].event_time.future", "at most 1h"),
    ] {
        assert!(
            p.0.iter()
                .any(|x| x.key == key && x.message.contains(needle) && x.line == Some(3)),
            "{key}: {p}"
        );
    }
}

#[test]
fn policy_whose_regions_cannot_reach_each_other() {
    // us-east-1 and eu-central-1 are joined only through eu-west-1, outside the policy.
    let text = PLACEMENT.replace(
        "regions = [\"eu-west-1\", \"eu-central-1\"]",
        "regions = [\"us-east-1\", \"eu-central-1\"]",
    );
    let text = text.replace("home = \"eu-central-1\"", "home = \"us-east-1\"");
    let p = placement(&text).unwrap_err();
    assert_eq!(p.kinds(), vec![ProblemKind::PolicyDisconnected], "{p}");
    assert_eq!(p.0[0].key, "policies[0].regions");
    assert_eq!(p.0[0].line, Some(line_of(&text, "regions = [", 0)));
}

#[test]
fn reference_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    let d = Deployment::load(
        &root.join("four-continents.toml"),
        Some(&root.join("placement.toml")),
    )
    .unwrap();
    let t = &d.topology;
    assert!(t.replicas.len() >= 24 && t.regions.len() >= 12 && t.continents.len() >= 4);
    let multi = t.regions.values().filter(|r| {
        r.replicas
            .iter()
            .filter(|id| t.replicas[*id].role == pangea_topology::Role::Serving)
            .count()
            >= 2
    });
    assert!(multi.count() >= 2);
    assert!(
        t.replicas
            .values()
            .any(|r| r.role == pangea_topology::Role::Batch)
    );
    assert!(
        t.replicas
            .values()
            .any(|r| r.role == pangea_topology::Role::Relay)
    );
    assert!(d.placement.policy(&"eu-resident".into()).is_some());
    // Every profile is granted tables the placement defines (Deployment::load checks).
    for p in t.app_profiles.values() {
        assert!(!p.tables.is_empty(), "{}", p.name);
        assert_eq!(
            p.access("ad_profiles"),
            Some(Access::ReadWrite),
            "{}",
            p.name
        );
    }
    let single = Deployment::load(
        &root.join("single-replica.toml"),
        Some(&root.join("single-replica.placement.toml")),
    )
    .unwrap();
    assert_eq!(single.topology.replicas.len(), 1);
    let local = Deployment::load(
        &root.join("local-3-regions.toml"),
        Some(&root.join("local-3-regions.placement.toml")),
    )
    .unwrap();
    assert!((6..=9).contains(&local.topology.replicas.len()) && local.topology.regions.len() == 3);
}

// ---- App profiles and their permissions ------------------------------------------

fn deployment(topology: &str, placement: Option<&str>) -> Result<Deployment, Problems> {
    Deployment::parse(
        Path::new("topo.toml"),
        topology,
        placement.map(|p| (Path::new("place.toml"), p)),
    )
}

/// BASE with the `frontend` profile's grant line replaced by `lines`.
fn frontend_grants(lines: &str) -> String {
    BASE.replacen("tables = { ad_profiles = \"read-write\" }", lines, 1)
}

#[test]
fn app_profiles_grant_tables_and_policies() -> Result<(), Problems> {
    let text = frontend_grants(
        "tables = { ad_profiles = \"read-write\", campaigns = \"read\" }\npolicies = [\"global\", \"eu-resident\"]",
    );
    let t = topo(&text)?;
    let frontend = &t.app_profiles["frontend"];
    assert_eq!(frontend.access("ad_profiles"), Some(Access::ReadWrite));
    assert_eq!(frontend.access("campaigns"), Some(Access::Read));
    // Default deny: anything not listed, system tables included.
    assert_eq!(frontend.access("users"), None);
    assert_eq!(frontend.access("_location"), None);
    assert!(frontend.may_touch_policy(&ScopeId::global()));
    assert!(frontend.may_touch_policy(&ScopeId::new("eu-resident")));
    assert!(!frontend.may_touch_policy(&ScopeId::new("apac")));

    // Without `policies`, every policy is open.
    let batch = &t.app_profiles["batch"];
    assert_eq!(batch.policies, None);
    assert!(batch.may_touch_policy(&ScopeId::new("apac")));
    assert_eq!(batch.access("ad_profiles"), Some(Access::Read));
    assert_eq!(batch.routing, Routing::Pinned(vec!["use1-b".into()]));
    Ok(())
}

#[test]
fn access_levels() {
    assert!(Access::ReadWrite.allows(Access::Read));
    assert!(Access::ReadWrite.allows(Access::ReadWrite));
    assert!(Access::Read.allows(Access::Read));
    assert!(!Access::Read.allows(Access::ReadWrite));
    assert_eq!(Access::Read.as_str(), "read");
    assert_eq!(Access::ReadWrite.as_str(), "read-write");
    assert_eq!(
        serde_json::to_string(&[Access::Read, Access::ReadWrite]).unwrap(),
        r#"["read","read-write"]"#
    );
}

#[test]
fn grants_may_be_written_as_a_sub_table() -> Result<(), Problems> {
    let text = BASE.replacen(
        "routing = \"nearest\"\ntables = { ad_profiles = \"read-write\" }",
        "routing = \"nearest\"\n\n[app_profiles.tables]\nad_profiles = \"read-write\"\nsegments = \"rw\"",
        1,
    );
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidValue], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].tables.segments");
    assert_eq!(p.0[0].line, Some(line_of(&text, "segments = \"rw\"", 0)));

    let t = topo(&text.replace("segments = \"rw\"", "segments = \"read\""))?;
    assert_eq!(
        t.app_profiles["frontend"].access("segments"),
        Some(Access::Read)
    );
    Ok(())
}

#[test]
fn access_must_be_read_or_read_write() {
    let text = frontend_grants("tables = { ad_profiles = \"write\" }");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidValue], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].tables.ad_profiles");
    assert_eq!(p.0[0].line, Some(line_of(&text, "\"write\"", 0)));
    assert!(
        p.0[0]
            .message
            .contains("\"write\" is not one of read, read-write")
    );
    assert_eq!(p.0[0].file, Path::new("topo.toml"));
}

#[test]
fn system_tables_and_bad_table_names_cannot_be_granted() {
    // Inline tables are one line in TOML 1.0: a sub-table puts each grant on its own.
    let text = BASE.replacen(
        "routing = \"nearest\"\ntables = { ad_profiles = \"read-write\" }",
        "routing = \"nearest\"\n\n[app_profiles.tables]\nad_profiles = \"read\"\n_location = \"read\"\n\"bad name\" = \"read\"",
        1,
    );
    let p = problems(&text);
    assert_eq!(
        p.kinds(),
        vec![ProblemKind::InvalidName, ProblemKind::InvalidName],
        "{p}"
    );
    let system =
        p.0.iter()
            .find(|x| x.key == "app_profiles[0].tables._location")
            .expect("the system table");
    assert_eq!(system.line, Some(line_of(&text, "_location", 0)));
    assert!(
        system
            .message
            .contains("system tables cannot be granted to app profiles; they are reached through operator commands"),
        "{}",
        system.message
    );
    let bad =
        p.0.iter()
            .find(|x| x.key == "app_profiles[0].tables.bad name")
            .expect("the bad name");
    assert_eq!(bad.line, Some(line_of(&text, "\"bad name\"", 0)));
    assert!(bad.message.contains("contains ' '"), "{}", bad.message);
}

#[test]
fn a_profile_must_grant_some_table() {
    // No `tables` at all…
    let text = frontend_grants("");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::MissingField], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0]");
    assert_eq!(p.0[0].line, Some(line_of(&text, "[[app_profiles]]", 0)));
    assert!(
        p.0[0].message.contains(
            "app profile \"frontend\" grants no table: add tables = { <table> = \"read\" }"
        ),
        "{p}"
    );
    // …or an empty one.
    let text = frontend_grants("tables = {}");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidValue], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].tables");
    assert_eq!(p.0[0].line, Some(line_of(&text, "tables = {}", 0)));
    assert!(p.0[0].message.contains("grants no table"), "{p}");
}

#[test]
fn policy_names_are_checked_and_an_empty_list_is_refused() {
    let text = frontend_grants(
        "tables = { ad_profiles = \"read\" }\npolicies = [\"eu resident\", \"global\", \"global\"]",
    );
    let p = problems(&text);
    assert_eq!(
        p.kinds(),
        vec![ProblemKind::InvalidName, ProblemKind::Duplicate],
        "{p}"
    );
    assert_eq!(p.0[0].key, "app_profiles[0].policies[0]");
    assert_eq!(p.0[1].key, "app_profiles[0].policies[2]");
    let line = line_of(&text, "policies = [", 0);
    assert!(p.0.iter().all(|x| x.line == Some(line)), "{p}");

    let text = frontend_grants("tables = { ad_profiles = \"read\" }\npolicies = []");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::ProfileReachesNothing], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].policies");
    assert_eq!(p.0[0].line, Some(line_of(&text, "policies = []", 0)));
    assert!(p.0[0].message.contains("lists no policy"), "{p}");
}

#[test]
fn unknown_keys_in_a_profile_are_refused() {
    let text = frontend_grants("tabels = { ad_profiles = \"read\" }");
    let p = problems(&text);
    assert_eq!(p.kinds(), vec![ProblemKind::UnknownField], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].tabels");
    assert_eq!(p.0[0].line, Some(line_of(&text, "tabels", 0)));
    assert!(p.0[0].message.contains("tables"), "{p}");
}

#[test]
fn grants_are_checked_against_the_placement() -> Result<(), Problems> {
    let d = deployment(BASE, Some(PLACEMENT))?;
    assert_eq!(
        d.topology.app_profiles["frontend"].access("ad_profiles"),
        Some(Access::ReadWrite)
    );

    // A table and a policy the placement does not define, reported at the topology
    // file's lines.
    let text = frontend_grants(
        "tables = { ad_profiles = \"read\", campaigns = \"read\" }\npolicies = [\"global\", \"apac\"]",
    );
    let p = deployment(&text, Some(PLACEMENT)).unwrap_err();
    assert_eq!(
        p.kinds(),
        vec![ProblemKind::UnknownReference, ProblemKind::UnknownReference],
        "{p}"
    );
    assert!(p.0.iter().all(|x| x.file == Path::new("topo.toml")), "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].tables.campaigns");
    assert_eq!(p.0[0].line, Some(line_of(&text, "campaigns", 0)));
    assert!(
        p.0[0].message.contains("unknown table \"campaigns\"")
            && p.0[0].message.contains("defines: ad_profiles"),
        "{p}"
    );
    assert_eq!(p.0[1].key, "app_profiles[0].policies[1]");
    assert_eq!(p.0[1].line, Some(line_of(&text, "\"apac\"", 0)));
    assert!(p.0[1].message.contains("unknown policy \"apac\""), "{p}");

    // Known names pass.
    let text = frontend_grants(
        "tables = { ad_profiles = \"read\" }\npolicies = [\"global\", \"eu-resident\"]",
    );
    let d = deployment(&text, Some(PLACEMENT))?;
    assert!(!d.topology.app_profiles["frontend"].may_touch_policy(&ScopeId::new("apac")));
    Ok(())
}

#[test]
fn a_pinned_profile_must_reach_rows_of_its_policies() -> Result<(), Problems> {
    // `batch` is pinned to use1-b in us-east-1; eu-resident is Europe only.
    let text = BASE.replace(
        "tables = { ad_profiles = \"read\" }",
        "tables = { ad_profiles = \"read\" }\npolicies = [\"eu-resident\"]",
    );
    // The topology alone cannot tell.
    topo(&text)?;
    let p = deployment(&text, Some(PLACEMENT)).unwrap_err();
    assert_eq!(p.kinds(), vec![ProblemKind::ProfileReachesNothing], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[1].policies");
    assert_eq!(
        p.0[0].line,
        Some(line_of(&text, "policies = [\"eu-resident\"]", 0))
    );
    assert!(
        p.0[0].message.contains("\"batch\"")
            && p.0[0].message.contains("use1-b")
            && p.0[0].message.contains("could never read a row"),
        "{p}"
    );

    // One pinned replica inside one of the policies is enough.
    let text = text
        .replace(
            "replicas = [\"use1-b\"]",
            "replicas = [\"use1-b\", \"euc1-a\"]",
        )
        .replace("priority = \"batch\"", "priority = \"serving\"");
    deployment(&text, Some(PLACEMENT))?;
    let text = BASE.replace(
        "tables = { ad_profiles = \"read\" }",
        "tables = { ad_profiles = \"read\" }\npolicies = [\"eu-resident\", \"global\"]",
    );
    deployment(&text, Some(PLACEMENT))?;
    Ok(())
}

#[test]
fn without_a_placement_file_grants_are_checked_in_the_topology_alone() -> Result<(), Problems> {
    // Checking a topology alone (`pangea topology check TOPOLOGY`): what needs the
    // placement is not checked…
    let text = frontend_grants(
        "tables = { ad_profiles = \"read\", campaigns = \"read\" }\npolicies = [\"apac\"]",
    );
    let d = deployment(&text, None)?;
    assert_eq!(d.placement.schema.table("ad_profiles"), None);
    // …and what does not, is.
    let p = deployment(&frontend_grants("tables = { _jobs = \"read\" }"), None).unwrap_err();
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidName], "{p}");
    Ok(())
}

#[test]
fn every_profile_problem_is_reported_at_once_in_file_order() {
    let text = BASE
        .replace(
            "tables = { ad_profiles = \"read-write\" }",
            "tables = { ad_profiles = \"write\", _jobs = \"read\" }\npolicies = []",
        )
        .replace("tables = { ad_profiles = \"read\" }", "");
    let p = problems(&text);
    assert_eq!(
        p.kinds(),
        vec![
            ProblemKind::InvalidName,
            ProblemKind::InvalidValue,
            ProblemKind::ProfileReachesNothing,
            ProblemKind::MissingField,
        ],
        "{p}"
    );
    let lines: Vec<_> = p.0.iter().map(|p| p.line.unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{lines:?}");
}

#[test]
fn a_diff_notices_permission_changes() -> Result<(), Problems> {
    let old = deployment(BASE, Some(PLACEMENT))?;
    assert!(old.diff(&old).is_empty());
    let text = frontend_grants("tables = { ad_profiles = \"read\" }");
    let new = deployment(&text, Some(PLACEMENT))?;
    let diff = old.diff(&new);
    assert!(!diff.is_empty());
    assert_eq!(diff.app_profile_changes.len(), 1, "{diff:?}");
    let change = &diff.app_profile_changes[0];
    assert_eq!(
        (change.name.as_str(), change.change),
        ("frontend", "permissions changed")
    );
    assert_eq!(
        change.old.as_ref().and_then(|p| p.access("ad_profiles")),
        Some(Access::ReadWrite)
    );
    assert_eq!(
        change.new.as_ref().and_then(|p| p.access("ad_profiles")),
        Some(Access::Read)
    );
    let json = serde_json::to_value(&diff).unwrap();
    assert_eq!(
        json["app_profile_changes"][0]["new"]["tables"]["ad_profiles"],
        "read"
    );
    Ok(())
}

#[test]
fn dot_names_and_oversized_files_are_refused() {
    // Replica ids become directory names: "." and ".." would escape.
    for id in [".", ".."] {
        let text = BASE.replacen("id = \"use1-a\"", &format!("id = \"{id}\""), 1);
        let p = problems(&text);
        assert!(
            p.0.iter().any(|p| p.message.contains("only of dots")),
            "{id}: {p}"
        );
    }
    // A file past the size limit is refused before it is parsed.
    let huge = format!(
        "{BASE}\n#{}\n",
        "x".repeat(pangea_topology::FILE_BYTES_MAX as usize)
    );
    let p = problems(&huge);
    assert!(
        p.0.iter()
            .any(|p| p.message.contains("limit 1048576") && p.line.is_none()),
        "{p}"
    );
    let path = std::env::temp_dir().join(format!("pangea-big-{}.toml", std::process::id()));
    std::fs::write(&path, &huge).unwrap();
    let p = Topology::load(&path).expect_err("too large");
    let _ = std::fs::remove_file(&path);
    assert!(p.to_string().contains("pangea-big-"), "{p}");
}

#[test]
fn a_profile_may_send_its_writes_to_the_rows_affinity_replica() -> Result<(), Problems> {
    use pangea_topology::WriteRouting;
    assert_eq!(
        topo(BASE)?.app_profiles["frontend"].writes,
        WriteRouting::Nearest,
        "absent: nearest"
    );
    let text = BASE.replacen(
        "routing = \"nearest\"",
        "routing = \"nearest\"\nwrites = \"row-affinity\"",
        1,
    );
    assert_eq!(
        topo(&text)?.app_profiles["frontend"].writes,
        WriteRouting::RowAffinity
    );
    let bad = text.replace("\"row-affinity\"", "\"affinity\"");
    let p = problems(&bad);
    assert_eq!(p.kinds(), vec![ProblemKind::InvalidValue], "{p}");
    assert_eq!(p.0[0].key, "app_profiles[0].writes");
    assert_eq!(p.0[0].line, Some(line_of(&bad, "writes = ", 0)));
    assert!(p.0[0].message.contains("not one of nearest, row-affinity"));
    Ok(())
}
