//! Shard groups in the files: `shard_groups`, a replica's `processes` and a
//! table's `partition_key` are validated with file, line and key; the plan shows
//! which process hosts which groups; a replica of many processes is one member
//! per process; changes to the layout are named (docs/sharding.md).

use pangea_topology::schema::validate_scope;
use pangea_topology::shard::{GroupId, PartitionKey, group_of};
use pangea_topology::{Deployment, ProblemKind, Problems, ReplicaId, ScopeId, Tree};
use std::collections::BTreeSet;
use std::path::Path;

const TOPOLOGY: &str = r#"name = "t"
intra_region_rtt_ms = 1.0
shard_groups = 64

[[continents]]
name = "na"

  [[continents.regions]]
  name = "us-east-1"

    [[continents.regions.replicas]]
    id = "use1-a"
    role = "serving"
    processes = 4

    [[continents.regions.replicas]]
    id = "use1-b"
    role = "serving"

[[continents]]
name = "eu"

  [[continents.regions]]
  name = "eu-west-1"

    [[continents.regions.replicas]]
    id = "euw1-a"
    role = "serving"
    processes = 3

[[links]]
a = "us-east-1"
b = "eu-west-1"
rtt_ms = 70.0
"#;

const PLACEMENT: &str = r#"[[tables]]
name = "events"
partition_key = { separator = ",", fields = 2 }

  [[tables.families]]
  name = "e"

[[tables]]
name = "ad_profiles"

  [[tables.families]]
  name = "profile"
"#;

fn deployment(topology: &str, placement: &str) -> Result<Deployment, Problems> {
    Deployment::parse(
        Path::new("topo.toml"),
        topology,
        Some((Path::new("place.toml"), placement)),
    )
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn the_files_declare_groups_processes_and_partition_keys() {
    let d = deployment(TOPOLOGY, PLACEMENT).unwrap();
    assert_eq!(d.topology.shard_groups, 64);
    assert_eq!(d.topology.replicas["use1-a"].processes, 4);
    assert_eq!(d.topology.replicas["use1-b"].processes, 1, "the default");
    let pk = d
        .placement
        .schema
        .table("events")
        .unwrap()
        .partition_key
        .clone();
    assert_eq!(
        pk,
        Some(PartitionKey {
            separator: b',',
            fields: 2
        })
    );
    assert_eq!(
        d.placement
            .schema
            .table("ad_profiles")
            .unwrap()
            .partition_key,
        None
    );
    // One user's events share a group: the group is the partition key's.
    let pk = pk.unwrap();
    let g = group_of(64, pk.of(b"app7,user42,1700000000"));
    assert_eq!(g, group_of(64, b"app7,user42"));
    assert_eq!(g, group_of(64, pk.of(b"app7,user42,1700000999")));
}

/// With G groups each policy replicates as G scopes, `policy/g`, and a row's
/// scope is its policy's scope for its partition key's group; with one group the
/// scopes are the policies, named as always.
#[test]
fn every_policy_replicates_as_one_scope_per_group() {
    let placement = format!(
        "{PLACEMENT}\n[[policies]]\nname = \"eu-only\"\nregions = [\"eu-west-1\"]\n\n\
         [[rules]]\ntable = \"ad_profiles\"\nprefix = \"eu/\"\npolicy = \"eu-only\"\n"
    );
    let d = deployment(TOPOLOGY, &placement).unwrap();
    let policies: Vec<&str> = d.policies().map(|p| p.as_str()).collect();
    assert_eq!(policies, ["global", "eu-only"]);
    let scopes: Vec<&ScopeId> = d.scopes().collect();
    assert_eq!(scopes.len(), 2 * 64);
    assert_eq!(scopes[0].as_str(), "global/0");
    assert_eq!(scopes[63].as_str(), "global/63");
    assert_eq!(scopes[64].as_str(), "eu-only/0");
    for s in &scopes {
        let (policy, group) = s.as_str().split_once('/').unwrap();
        assert_eq!(s.policy(), policy);
        assert_eq!(s.group(), Some(GroupId(group.parse().unwrap())));
        // A scope's members, residency and tree are its policy's, one process
        // of each replica standing for it (the system scope: every process).
        if *s == d.system_scope() {
            continue;
        }
        let p = ScopeId::from(policy);
        let replica = |r: &ReplicaId| d.topology.replicas[r].of.clone();
        let of = |set: BTreeSet<ReplicaId>| set.iter().map(replica).collect::<Vec<_>>();
        assert_eq!(of(d.scope_members(s)), of(d.scope_members(&p)));
        let edges = |t: Tree| {
            let mut e: Vec<_> = t
                .edges
                .iter()
                .map(|e| (replica(&e.a), replica(&e.b)))
                .collect();
            e.sort();
            e
        };
        assert_eq!(edges(d.tree(s, None)), edges(d.tree(&p, None)));
        for r in d.topology.replicas.values() {
            let hosted = d.scope_members(s).contains(&r.id);
            assert_eq!(
                d.allowed(&r.id, s),
                hosted && d.allowed(&r.of, &p),
                "{} in {s}",
                r.id
            );
        }
    }
    // A row's scope: its policy's, for its partition key's group.
    let pk = d
        .placement
        .schema
        .table("events")
        .unwrap()
        .partition_key
        .clone();
    let key = b"app7,user42,1700000000";
    let g = group_of(64, pk.as_ref().unwrap().of(key));
    assert_eq!(d.group_of("events", key), g);
    assert_eq!(
        d.scope_of("events", key).as_str(),
        format!("global/{}", g.0)
    );
    let g = group_of(64, b"eu/u1");
    assert_eq!(
        d.scope_of("ad_profiles", b"eu/u1").as_str(),
        format!("eu-only/{}", g.0)
    );
    // System tables stay in one stream: group 0 of global.
    assert_eq!(d.scope_of("_location", b"anything").as_str(), "global/0");
    assert_eq!(d.system_scope().as_str(), "global/0");

    // A grant of policies opens every group of them, and no other policy's.
    let granted = format!(
        "{TOPOLOGY}\n[[app_profiles]]\nname = \"eu-app\"\nrouting = \"nearest\"\n\
         priority = \"serving\"\ntables = {{ ad_profiles = \"read\" }}\npolicies = [\"eu-only\"]\n"
    );
    let d = deployment(&granted, &placement).unwrap();
    let eu_app = &d.topology.app_profiles["eu-app"];
    assert!(eu_app.may_touch_policy(&ScopeId::from("eu-only")));
    assert!(eu_app.may_touch_policy(&ScopeId::from("eu-only/5")));
    assert!(!eu_app.may_touch_policy(&ScopeId::from("global/5")));

    // One group: the scopes are the policies, named as they always were.
    let one = TOPOLOGY
        .replace("shard_groups = 64", "shard_groups = 1")
        .replace("processes = 4", "")
        .replace("processes = 3", "");
    let one = deployment(&one, &placement).unwrap();
    let scopes: Vec<&str> = one.scopes().map(|s| s.as_str()).collect();
    assert_eq!(scopes, ["global", "eu-only"]);
    assert_eq!(one.scope_of("ad_profiles", b"eu/u1").as_str(), "eu-only");
    assert_eq!(one.system_scope().as_str(), "global");
    assert_eq!(one.scopes().next().unwrap().group(), None);
}

/// Scope names on the wire: a policy name alone, or followed by `/` and a group
/// below the limit, written without leading zeros; anything else is refused.
#[test]
fn scope_names_are_checked() {
    for ok in ["global", "eu-only", "global/0", "eu-only/17", "x/4095"] {
        assert!(validate_scope(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "global/",
        "global/01",
        "global/4096",
        "global/-1",
        "global/1/2",
        "/3",
        "a b/1",
    ] {
        assert!(validate_scope(bad).is_err(), "{bad:?} accepted");
    }
    let e = validate_scope("global/4096").unwrap_err().to_string();
    assert!(e.contains("global/4096") && e.contains("4096"), "{e}");
}

#[test]
fn the_plan_shows_which_process_hosts_which_groups() {
    let plan = deployment(TOPOLOGY, PLACEMENT).unwrap().plan();
    assert_eq!(plan.shard_groups, 64);
    let by_replica = |id: &str| {
        plan.shards
            .iter()
            .find(|r| r.replica.as_str() == id)
            .unwrap()
            .groups
            .clone()
    };
    assert_eq!(by_replica("use1-a"), vec![0..16, 16..32, 32..48, 48..64]);
    assert_eq!(by_replica("use1-b"), vec![0..64]);
    assert_eq!(by_replica("euw1-a"), vec![0..22, 22..43, 43..64]);
}

#[test]
fn bad_groups_processes_and_partition_keys_are_named_with_their_line() {
    let topology = TOPOLOGY
        .replace("shard_groups = 64", "shard_groups = 0")
        .replace("processes = 3", "processes = 0");
    let p = deployment(&topology, PLACEMENT).unwrap_err();
    let found = |key: &str, line: usize, text: &str| {
        p.0.iter().any(|x| {
            x.key == key
                && x.line == Some(line)
                && x.kind == ProblemKind::InvalidValue
                && x.message.contains(text)
        })
    };
    assert!(
        found("shard_groups", line_of(&topology, "shard_groups"), "got 0"),
        "{p}"
    );
    assert!(
        found(
            "continents[1].regions[0].replicas[0].processes",
            line_of(&topology, "processes = 0"),
            "got 0"
        ),
        "{p}"
    );
    // A bad group count is one problem: replicas are not also blamed for it.
    assert_eq!(p.0.len(), 2, "{p}");

    // More processes than groups: each must host at least one.
    let topology = TOPOLOGY.replace("shard_groups = 64", "shard_groups = 2");
    let p = deployment(&topology, PLACEMENT).unwrap_err();
    assert!(
        p.0.iter().any(
            |x| x.key == "continents[0].regions[0].replicas[0].processes"
                && x.message.contains("1 ..= shard_groups (2)")
                && x.message.contains("got 4")
        ),
        "{p}"
    );

    let placement = PLACEMENT.replace(
        "partition_key = { separator = \",\", fields = 2 }",
        "partition_key = { separator = \"::\", fields = 0 }",
    );
    let p = deployment(TOPOLOGY, &placement).unwrap_err();
    let line = line_of(&placement, "partition_key");
    for (key, text) in [
        ("tables[0].partition_key.separator", "one ASCII character"),
        ("tables[0].partition_key.fields", "got 0"),
    ] {
        assert!(
            p.0.iter().any(|x| x.key == key
                && x.line == Some(line)
                && x.file == Path::new("place.toml")
                && x.message.contains(text)),
            "{key}: {p}"
        );
    }
}

#[test]
fn layout_changes_are_named_and_unchanged_files_have_none() {
    let d = deployment(TOPOLOGY, PLACEMENT).unwrap();
    assert!(d.layout_changes(&d).is_empty());
    let changed = deployment(
        &TOPOLOGY
            .replace("shard_groups = 64", "shard_groups = 128")
            .replace("processes = 4", "processes = 8"),
        &PLACEMENT.replace("fields = 2", "fields = 1"),
    )
    .unwrap();
    let changes = d.layout_changes(&changed).join("\n");
    assert!(
        changes.contains("shard_groups would change from 64 to 128"),
        "{changes}"
    );
    assert!(
        changes.contains("partition key of table events"),
        "{changes}"
    );
    assert!(
        changes.contains("replica use1-a would go from 4 processes to 8 processes"),
        "{changes}"
    );
    assert!(!changes.contains("ad_profiles"), "{changes}");
}

/// `use1-a` (4 processes) in the files of a resize to 6, at `phase`.
fn resizing(phase: &str) -> Deployment {
    deployment(
        &TOPOLOGY.replace(
            "processes = 4",
            &format!("processes = 6\n    resize_from = 4\n    resize_phase = \"{phase}\""),
        ),
        PLACEMENT,
    )
    .unwrap()
}

/// The system scope is on every process of the count: a process being added
/// follows it under process 0 until the new layout serves; one being drained
/// follows it from then on, taking no writes there, until it goes.
#[test]
fn added_and_drained_processes_follow_the_system_scope() {
    let drain = |phase: &str| {
        deployment(
            &TOPOLOGY.replace(
                "processes = 4",
                &format!("processes = 2\n    resize_from = 4\n    resize_phase = \"{phase}\""),
            ),
            PLACEMENT,
        )
        .unwrap()
    };
    for (d, process, serves) in [
        (resizing("copy"), "use1-a.p5", false),
        (resizing("serve"), "use1-a.p5", true),
        (drain("copy"), "use1-a.p3", true),
        (drain("serve"), "use1-a.p3", false),
    ] {
        let system = d.system_scope().clone();
        let r = &d.topology.replicas[&ReplicaId::from(process)];
        assert!(d.hosts(r, &system), "{process}");
        assert_eq!(d.serves(r, &system), serves, "{process}");
        assert_eq!(d.answers(&r.id, &system, true), serves, "{process}");
        if !serves {
            assert_eq!(
                d.leader_of(r, &system).map(|l| l.id.as_str()),
                Some("use1-a")
            );
            assert_eq!(
                d.tree(&system, None).neighbours(&r.id),
                [ReplicaId::from("use1-a")]
            );
        }
    }
}

/// A replica's processes change only by the steps of a resize, one at a time:
/// start (copy), serve, finish — or abandon before serving.
#[test]
fn a_resize_goes_step_by_step() {
    let before = deployment(TOPOLOGY, PLACEMENT).unwrap();
    let (copy, serve) = (resizing("copy"), resizing("serve"));
    let after = deployment(
        &TOPOLOGY.replace("processes = 4", "processes = 6"),
        PLACEMENT,
    )
    .unwrap();
    for (from, to) in [
        (&before, &copy),
        (&copy, &serve),
        (&serve, &after),
        (&copy, &before),
        (&serve, &serve),
    ] {
        assert_eq!(from.layout_changes(to), Vec::<String>::new());
    }
    for (from, to, says) in [
        (&before, &after, "from 4 processes to 6 processes"),
        (&before, &serve, "(phase serve)"),
        (&copy, &after, "(phase copy) to 6 processes"),
        (&serve, &before, "to 4 processes"),
    ] {
        let changes = from.layout_changes(to).join("\n");
        assert!(
            changes.contains("replica use1-a would go from") && changes.contains(says),
            "{changes}"
        );
    }
}

/// Bad resize keys are named with their line.
#[test]
fn bad_resize_keys_are_named_with_their_line() {
    for (keys, key, text) in [
        (
            "processes = 4\n    resize_from = 4\n    resize_phase = \"copy\"",
            "resize_from",
            "differ from processes (4), got 4",
        ),
        (
            "processes = 4\n    resize_from = 2\n    resize_phase = \"flip\"",
            "resize_phase",
            "\"flip\" is not one of copy, serve",
        ),
        (
            "processes = 4\n    resize_from = 2",
            "resize_from",
            "resize_phase is missing",
        ),
    ] {
        let topology = TOPOLOGY.replace("processes = 4", keys);
        let p = deployment(&topology, PLACEMENT).unwrap_err();
        let field = format!("continents[0].regions[0].replicas[0].{key}");
        assert!(
            p.0.iter().any(|x| x.key == field
                && x.line == Some(line_of(&topology, &format!("{key} =")))
                && x.message.contains(text)),
            "{key}: {p}"
        );
    }
}

/// While a resize runs, a moving group is hosted by its old and its new
/// process: one serves it (routes, the tree), the other follows as a leaf under
/// it; which one flips at the serve step. Processes being added exist from the
/// copy step on.
#[test]
fn a_moving_group_has_a_serving_host_and_a_follower_leaf() {
    // Group 12 of 64: process 0 of 4 (0–15), process 1 of 6 (11–21).
    let global = deployment(TOPOLOGY, PLACEMENT)
        .unwrap()
        .policies()
        .next()
        .unwrap()
        .clone();
    let scope = ScopeId::of_group(&global, 64, GroupId(12));
    for (phase, serving, following) in [
        ("copy", "use1-a", "use1-a.p1"),
        ("serve", "use1-a.p1", "use1-a"),
    ] {
        let d = resizing(phase);
        assert!(
            d.topology
                .replicas
                .contains_key(&ReplicaId::from("use1-a.p5"))
        );
        let r = |id: &str| &d.topology.replicas[&ReplicaId::from(id)];
        assert!(d.hosts(r(serving), &scope) && d.hosts(r(following), &scope));
        assert!(d.serves(r(serving), &scope) && !d.serves(r(following), &scope));
        assert_eq!(
            d.leader_of(r(following), &scope).map(|l| l.id.as_str()),
            Some(serving)
        );
        let tree = d.tree(&scope, None);
        assert_eq!(
            tree.neighbours(&following.into()),
            [ReplicaId::from(serving)]
        );
        assert!(
            tree.neighbours(&serving.into()).len() >= 2,
            "{phase}: {tree:?}"
        );
        // Reads and writes: the serving host; in the serve step the old host
        // still answers reads.
        assert!(d.answers(&serving.into(), &scope, true));
        assert!(!d.answers(&following.into(), &scope, true));
        assert_eq!(
            d.answers(&following.into(), &scope, false),
            phase == "serve"
        );
        // Clients route by the serving layout.
        assert_eq!(
            d.shards()
                .iter()
                .find(|s| s.replica.as_str() == "use1-a")
                .map(|s| s.groups.len()),
            Some(6)
        );
    }
}

/// A replica of P processes is P entries of the topology — `<id>`, `<id>.p1` …
/// — each a member of the scopes of the groups it hosts, listening on the
/// replica's port plus its index; the system scope is on every process.
#[test]
fn a_replica_of_many_processes_is_one_member_per_process() {
    let topology = TOPOLOGY.replace(
        "    id = \"use1-a\"\n    role = \"serving\"\n",
        "    id = \"use1-a\"\n    role = \"serving\"\n    address = \"127.0.0.1:7000\"\n",
    );
    let d = deployment(&topology, PLACEMENT).unwrap();
    let ids: Vec<&str> = d.topology.replicas.keys().map(|r| r.as_str()).collect();
    assert_eq!(
        ids,
        [
            "euw1-a",
            "euw1-a.p1",
            "euw1-a.p2",
            "use1-a",
            "use1-a.p1",
            "use1-a.p2",
            "use1-a.p3",
            "use1-b"
        ]
    );
    let p2 = &d.topology.replicas["use1-a.p2"];
    assert_eq!((p2.of.as_str(), p2.index, p2.processes), ("use1-a", 2, 4));
    assert_eq!(p2.address.as_deref(), Some("127.0.0.1:7002"));
    assert_eq!(p2.region.as_str(), "us-east-1");
    assert_eq!(d.topology.regions["us-east-1"].replicas.len(), 5);
    // Group 37 of 64: process 2 of 4 (32–47), process 1 of 3 (22–42), use1-b.
    let global = d.policies().next().unwrap().clone();
    let scope = ScopeId::of_group(&global, 64, GroupId(37));
    let members: Vec<String> = d
        .scope_members(&scope)
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(members, ["euw1-a.p1", "use1-a.p2", "use1-b"]);
    assert!(d.allowed(&"use1-a.p2".into(), &scope));
    assert!(!d.allowed(&"use1-a".into(), &scope));
    // Every process holds the system scope: location metadata and jobs.
    assert_eq!(d.scope_members(d.system_scope()).len(), 8);
    // The plan shows each replica once, its processes' groups.
    assert_eq!(d.plan().shards.len(), 3);
    assert_eq!(group_of(1, b"anything"), GroupId(0));
}

/// A process's id may not be another replica's, and its port must exist.
#[test]
fn process_ids_and_ports_that_collide_are_named() {
    let topology = TOPOLOGY
        .replace("    id = \"use1-b\"\n", "    id = \"use1-a.p3\"\n")
        .replace(
            "    id = \"euw1-a\"\n    role = \"serving\"\n",
            "    id = \"euw1-a\"\n    role = \"serving\"\n    address = \"127.0.0.1:65534\"\n",
        );
    let problems = deployment(&topology, PLACEMENT).unwrap_err();
    let text = problems.to_string();
    assert!(
        text.contains("process 3 of replica \"use1-a\" is named \"use1-a.p3\""),
        "{text}"
    );
    assert!(
        text.contains("continents[0].regions[0].replicas[0].processes"),
        "{text}"
    );
    assert!(text.contains("address \"127.0.0.1:65534\""), "{text}");
    assert!(
        text.contains("continents[1].regions[0].replicas[0].address"),
        "{text}"
    );
}

/// A scan's prefix stays in one shard group only when it holds the whole
/// partition key: the server then checks one group's watermarks, else all.
#[test]
fn a_prefix_names_one_group_only_when_it_holds_the_partition_key() {
    let d = deployment(TOPOLOGY, PLACEMENT).unwrap();
    let user = d.group_of("events", b"app,user,1700000000");
    assert_eq!(d.prefix_group("events", b"app,user,"), Some(user));
    assert_eq!(d.prefix_group("events", b"app,user,17"), Some(user));
    assert_eq!(d.prefix_group("events", b"app,user"), None, "user10 too");
    assert_eq!(d.prefix_group("events", b"app,"), None);
    assert_eq!(d.prefix_group("events", b""), None);
    assert_eq!(
        d.prefix_group("ad_profiles", b"eu/user,1,"),
        None,
        "no partition key declared: the row key is the partition key"
    );
    assert_eq!(d.prefix_group("_location", b""), Some(GroupId(0)));
    let one = TOPOLOGY
        .replace("shard_groups = 64\n", "")
        .replace("    processes = 4\n", "")
        .replace("    processes = 3\n", "");
    let d = deployment(&one, PLACEMENT).unwrap();
    assert_eq!(d.prefix_group("ad_profiles", b""), Some(GroupId(0)));
}
