//! The typed admin client against the node's admin server (`pangea_node::admin`)
//! with a state the test controls, on 127.0.0.1.

use pangea_node::admin::{AdminState, Health, OriginMark, ScopeMarks, Watermarks, serve};
use pangea_ops::admin::{Admin, AdminError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

struct State {
    healthy: AtomicBool,
}

impl AdminState for State {
    fn metrics_text(&self) -> String {
        "# TYPE pangea_up gauge\npangea_up 1\n# EOF\n".into()
    }

    fn health(&self) -> Health {
        let ok = self.healthy.load(Ordering::SeqCst);
        Health {
            ok,
            replica: "r1".into(),
            region: "eu-west-1".into(),
            detail: serde_json::json!({ "phase": if ok { "ready" } else { "catching up" } }),
        }
    }

    fn watermarks(&self) -> Watermarks {
        Watermarks {
            replica: "r1".into(),
            region: "eu-west-1".into(),
            scopes: vec![ScopeMarks {
                scope: "global".into(),
                origins: [(
                    "r2".to_owned(),
                    OriginMark {
                        sequence: 7,
                        ..OriginMark::default()
                    },
                )]
                .into(),
                ..ScopeMarks::default()
            }],
            apply_lag: serde_json::json!({}),
        }
    }
}

#[test]
fn the_client_reads_what_the_server_serves_and_names_what_went_wrong() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = Arc::new(State {
        healthy: AtomicBool::new(false),
    });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(serve(listener, state.clone(), async {
        let _ = stopped.await;
    }));

    let admin = Admin::new(&addr.to_string()).unwrap();
    let (ok, health) = admin.health().unwrap();
    assert!(!ok, "503 while unhealthy");
    assert_eq!(health.detail["phase"], "catching up");
    state.healthy.store(true, Ordering::SeqCst);
    assert!(admin.health().unwrap().0);
    let w = admin.watermarks().unwrap();
    assert_eq!(w.sequences_of("r2")["global"], 7);
    assert!(admin.metrics().unwrap().contains("pangea_up 1"));
    assert_eq!(admin.get("/nope").unwrap().status, 404);
    // Fault injection is off on this replica: the status and the server's reason.
    match admin.fault("heal", "") {
        Err(AdminError::Status { status, body, .. }) => {
            assert_eq!(status, 403);
            assert!(body.contains("fault injection is off"), "{body}");
        }
        other => panic!("{other:?}"),
    }

    let _ = stop.send(());
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), server).await })
        .expect("the server stops")
        .unwrap()
        .unwrap();
    // Nobody listens any more: a connection error naming the address.
    let err = admin.health().unwrap_err();
    assert!(
        matches!(err, AdminError::Connect(a, _) if a == addr),
        "{err:?}"
    );
    assert!(matches!(
        Admin::new("not an address"),
        Err(AdminError::Address(..))
    ));
}
