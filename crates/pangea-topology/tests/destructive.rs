//! `Deployment::destructive_changes`: what an apply must be told explicitly.

use pangea_topology::Deployment;
use pangea_topology::plan::Destructive;
use std::path::Path;

fn files() -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    (
        std::fs::read_to_string(root.join("local-3-regions.toml")).unwrap(),
        std::fs::read_to_string(root.join("local-3-regions.placement.toml")).unwrap(),
    )
}

fn deployment(topology: &str, placement: &str) -> Deployment {
    Deployment::parse(
        Path::new("t.toml"),
        topology,
        Some((Path::new("p.toml"), placement)),
    )
    .unwrap()
}

#[test]
fn widening_residency_or_a_policy_and_dropping_a_family_are_named() {
    let (t, p) = files();
    let old = deployment(&t, &p);
    assert!(old.destructive_changes(&old).is_empty());

    // eu/ rows from eu-resident to global.
    let widened = deployment(
        &t,
        &p.replace(
            "prefix = \"eu/\"\npolicy = \"eu-resident\"",
            "prefix = \"eu/\"\npolicy = \"global\"",
        ),
    );
    let changes = old.destructive_changes(&widened);
    assert!(
        changes.iter().any(
            |c| matches!(c, Destructive::WidenResidency { table, prefix, .. }
            if table == "ad_profiles" && prefix == "eu/")
        ),
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .any(|c| c.flag() == "--widen-residency ad_profiles:eu/")
    );
    // The reverse narrows: nothing to name.
    assert!(widened.destructive_changes(&old).is_empty());

    // eu-resident gains us-east-1.
    let grown = deployment(
        &t,
        &p.replace(
            "regions = [\"eu-west-1\"]",
            "regions = [\"eu-west-1\", \"us-east-1\"]",
        ),
    );
    let changes = old.destructive_changes(&grown);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].flag(), "--widen-policy eu-resident");

    // The events family leaves ad_profiles.
    let events =
        "  [[tables.families]]\n  name = \"events\"\n  max_versions = 10\n  ttl = \"30d\"\n";
    assert!(p.contains(events));
    let without = p.replace(events, "");
    let changes = old.destructive_changes(&deployment(&t, &without));
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].flag(), "--drop-family ad_profiles:events");
}

/// Changes no flag allows (`Deployment::layout_changes`): a family changing
/// type, an event-time window narrowing or going away. Widening it is fine.
#[test]
fn family_types_and_narrower_event_time_windows_are_refused() {
    let (t, p) = files();
    let old = deployment(&t, &p);
    assert!(old.layout_changes(&old).is_empty());
    let counter = "  name = \"impressions\"\n  type = \"counter\"\n";
    assert!(p.contains(counter));
    let cells = deployment(
        &t,
        &p.replace(counter, "  name = \"impressions\"\n  type = \"cells\"\n"),
    );
    let changes = old.layout_changes(&cells).join("\n");
    assert!(
        changes.contains(
            "family impressions of table ad_profiles would change type from counter to cells"
        ),
        "{changes}"
    );
    let window = "event_time = { past = \"90d\" }";
    assert!(p.contains(window));
    for narrower in ["event_time = { past = \"30d\" }", ""] {
        let changes = old.layout_changes(&deployment(&t, &p.replace(window, narrower)));
        assert!(
            changes
                .iter()
                .any(|c| c.contains("event_time window of table ad_profiles")
                    && c.contains("7776000000 ms")),
            "{narrower:?}: {changes:?}"
        );
    }
    let wider = deployment(&t, &p.replace(window, "event_time = { past = \"365d\" }"));
    assert!(old.layout_changes(&wider).is_empty());
}
