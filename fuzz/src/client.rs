//! Client frames: what a serving replica does with the bytes of client requests.
//!
//! The input is one byte choosing who calls (the identity its certificate would
//! carry: a client of `frontend`, a loader of `frontend`, an operator, a replica, or
//! a client of an app profile the topology lacks), then a sequence of
//! length-prefixed `pb::ClientRequest` frames (each would be its own QUIC stream;
//! here they reach one in-memory replica in turn, so writes of earlier requests are
//! there for later reads). Every request is first authorized as the node does it
//! (`pangea_core::auth`: the action, the rows' policies, a loader's `MergeRow`
//! checks). Each goes through the real decoder
//! (`pangea_net::decode_frame` with the node's client limit, `FRAME_BYTES_MAX`) and
//! then through the request handling of `pangea-node`'s `serve::process`, mirrored
//! here on the core API (that module needs the node's runtime, store and
//! certificates): row key and key-count limits, the table and placement checks,
//! consistency tokens (`Token::decode`) and the read decision, row filters and
//! `RowState::read`, `RowMutation::from_proto` with the schema check, and
//! `Replica::propose` followed by a flush. Not mirrored: the app-profile routing
//! check (a comparison with the caller's certificate), placement moves, audits and
//! reloads (past authorization).
//!
//! Checked besides "no panic": a committed write's token parses back to itself and
//! the replica's own watermark covers it (read-your-writes on the replica that
//! took the write); every response encodes as a frame; nothing is ever written to a
//! system table, and no identity but a loader gets a `MergeRow` through.

use crate::replication::{drive, frame_len};
use crate::{REPLICA, at, deployment};
use bytes::Bytes;
use pangea_core::auth::{self, Principal};
use pangea_core::limits::Limited;
use pangea_core::read::{Consistency, Decision, decide};
use pangea_core::replica::{Config, Event, Now, Replica};
use pangea_core::{
    BytesRange, Limits, MemStorage, Mutation, ReadFilter, ReplicaId, RowMutation, ScopeId,
    ScopeWatermarks, Storage, Token,
};
use pangea_net::{FRAME_BYTES_MAX, decode_frame, encode_frame};
use pangea_proto::v1 as pb;
use std::ops::Bound;

// As in pangea-node's serve.rs.
const GET_MANY_KEYS_MAX: usize = 1_000;
const SCAN_ROWS_MAX: usize = 1_000;
const SCAN_ROWS_DEFAULT: usize = 100;

/// The caller chosen by the input's first byte.
pub fn principal(byte: u8) -> Principal {
    match byte % 5 {
        0 => Principal::Client {
            name: "client-frontend".into(),
            app_profile: "frontend".into(),
        },
        1 => Principal::Loader {
            name: "loader-frontend".into(),
            app_profile: "frontend".into(),
        },
        2 => Principal::Operator {
            name: "operator".into(),
        },
        3 => Principal::Replica {
            id: "use1-a".into(),
        },
        _ => Principal::Client {
            name: "stranger".into(),
            app_profile: "nobody".into(),
        },
    }
}

pub fn client_frame(data: &[u8]) {
    let Some((&who, data)) = data.split_first() else {
        return;
    };
    let who = principal(who);
    let d = deployment();
    let mut r = Replica::new(
        ReplicaId::from(REPLICA),
        d,
        Config::default(),
        MemStorage::new(),
        7,
        at(0),
    )
    .expect("an in-memory replica opens");
    let mut stream = data;
    let mut ms = 0;
    loop {
        ms += 7;
        let now = at(ms);
        let used = match decode_frame::<pb::ClientRequest>(stream, FRAME_BYTES_MAX) {
            Ok(None) => break,
            Ok(Some((req, used))) => {
                let response = match process(&mut r, &who, now, req) {
                    Ok(resp) => resp,
                    Err(message) => pb::client_response::Response::Error(pb::Error {
                        code: 0,
                        message,
                        ..Default::default()
                    }),
                };
                encode_frame(&pb::ClientResponse {
                    served_by: None,
                    response: Some(response),
                })
                .expect("a response encodes");
                used
            }
            // The node answers with an error and closes the stream.
            Err(pangea_net::Error::FrameTooLarge { .. }) => break,
            Err(pangea_net::Error::FrameDecode(_)) => frame_len(stream),
            Err(e) => panic!("decode_frame returned a transport error: {e}"),
        };
        stream = &stream[used..];
    }
}

type Response = pb::client_response::Response;

fn process(
    r: &mut Replica<MemStorage>,
    who: &Principal,
    now: Now,
    req: pb::ClientRequest,
) -> Result<Response, String> {
    use pb::client_request::Request as R;
    let limits: Limits = r.config().limits;
    let d = r.deployment().clone();
    let action = auth::action_of(&req).ok_or("empty request")?;
    auth::authorize(&d, who, &action).map_err(|e| e.to_string())?;
    let may_touch =
        |scope: &ScopeId| auth::authorize_rows(&d, who, scope).map_err(|e| e.to_string());
    match req.request.ok_or("empty request")? {
        R::Get(g) => {
            Limits::check(Limited::RowKey, g.row_key.len(), limits.row_key_bytes_max)
                .map_err(|e| e.to_string())?;
            let scope = scope_here(r, &g.table, &g.row_key)?;
            may_touch(&scope)?;
            let c = consistency(g.consistency)?;
            admit(r, &scope, &c, now)?;
            let row = read_row(r, &g.table, &g.row_key, &filter(g.filter)?.under(&c), now)?;
            Ok(Response::Get(pb::GetResponse { row }))
        }
        R::GetMany(g) => {
            if g.row_keys.len() > GET_MANY_KEYS_MAX {
                return Err(format!("{} keys", g.row_keys.len()));
            }
            let c = consistency(g.consistency)?;
            let f = filter(g.filter)?.under(&c);
            let mut scope: Option<ScopeId> = None;
            let mut rows = Vec::new();
            for key in &g.row_keys {
                let s = scope_here(r, &g.table, key)?;
                if scope.as_ref().is_some_and(|x| *x != s) {
                    return Err("keys span placement policies".into());
                }
                if scope.is_none() {
                    may_touch(&s)?;
                    admit(r, &s, &c, now)?;
                    scope = Some(s);
                }
                rows.push(
                    read_row(r, &g.table, key, &f, now)?.unwrap_or_else(|| pb::Row {
                        key: key.clone(),
                        families: vec![],
                    }),
                );
            }
            Ok(Response::GetMany(pb::GetManyResponse { rows }))
        }
        R::ScanPrefix(s) => {
            let scope = scope_here(r, &s.table, &s.prefix)?;
            may_touch(&scope)?;
            let c = consistency(s.consistency)?;
            admit(r, &scope, &c, now)?;
            let limit = match s.limit as usize {
                0 => SCAN_ROWS_DEFAULT,
                n => n.min(SCAN_ROWS_MAX),
            };
            let f = filter(s.filter)?.under(&c);
            if !(s.row_sample >= 0.0 && s.row_sample <= 1.0) {
                return Err(format!("row_sample {}", s.row_sample));
            }
            let mut range = BytesRange::prefix(&s.prefix);
            if let Some(within) = s.range {
                range = range.intersect(&BytesRange::from_proto(within));
            }
            let wanted = range.clone();
            if !s.resume_after.is_empty() {
                let past = Bound::Excluded(s.resume_after.clone());
                range = range.intersect(&if s.reverse {
                    BytesRange {
                        start: Bound::Unbounded,
                        end: past,
                    }
                } else {
                    BytesRange {
                        start: past,
                        end: Bound::Unbounded,
                    }
                });
            }
            let found = r
                .storage()
                .scan_range(&s.table, &range, s.reverse, limit + 1)
                .map_err(|e| e.to_string())?;
            let more = found.len() > limit;
            let mut out = Vec::new();
            let mut last = Bytes::new();
            for (key, row) in found.into_iter().take(limit) {
                assert!(
                    key.starts_with(&s.prefix) && wanted.contains(&key),
                    "scan returned a key outside the prefix or range"
                );
                last = key.clone();
                let row_scope = r.scope_of(&s.table, &key);
                // As the node, without its page rules (a sample's fraction is
                // checked, the rows it leaves out skipped).
                if !d.allowed(r.id(), &row_scope)
                    || auth::authorize_rows(&d, who, &row_scope).is_err()
                    || (s.row_sample != 0.0 && !pangea_core::filter::in_sample(&key, s.row_sample))
                {
                    continue;
                }
                if let Some(mut row) =
                    row.read(&key, &f, d.placement.schema.table(&s.table), now.wall_ms)
                {
                    if s.keys_only {
                        row.families.clear();
                    }
                    out.push(row);
                }
            }
            let resume_key = if more { last } else { Bytes::new() };
            Ok(Response::ScanPrefix(pb::ScanPrefixResponse {
                rows: out,
                resume_key,
            }))
        }
        R::Mutate(m) => {
            let m = m.mutation.ok_or("mutate without a mutation")?;
            let token = mutate_row(r, who, now, &limits, m)?;
            Ok(Response::Mutate(pb::MutateResponse { token }))
        }
        // As the node: each row checked and applied alone, each its own outcome.
        R::MutateRows(b) => {
            Limits::check(Limited::BatchRows, b.rows.len(), limits.batch_rows_max)
                .map_err(|e| e.to_string())?;
            let rows = b
                .rows
                .into_iter()
                .map(|mut m| {
                    if m.table.is_empty() {
                        m.table.clone_from(&b.table);
                    }
                    if m.table != b.table {
                        return Err("row of another table in a batch".to_owned());
                    }
                    mutate_row(r, who, now, &limits, m)
                })
                .map(|o| match o {
                    Ok(token) => pb::RowOutcome { token, error: None },
                    Err(message) => pb::RowOutcome {
                        token: Default::default(),
                        error: Some(pb::Error {
                            code: 0,
                            message,
                            ..Default::default()
                        }),
                    },
                })
                .collect();
            Ok(Response::MutateRows(pb::MutateRowsResponse { rows }))
        }
        R::Watermarks(w) => {
            let scopes: Vec<ScopeId> = r.scopes().cloned().collect();
            let scopes = scopes
                .iter()
                .filter(|s| w.scope.is_empty() || s.as_str() == w.scope)
                .filter(|s| may_touch(s).is_ok())
                .filter_map(|s| r.watermarks(s))
                .map(|wm| wm.to_proto())
                .collect();
            Ok(Response::Watermarks(pb::WatermarkResponse { scopes }))
        }
        // The node's own call: a page of the replica's location metadata from the
        // cursor a client sent (any bytes: a foreign or garbage cursor resets).
        R::LocationChanges(c) => Ok(Response::LocationChanges(
            pangea_core::location::changes_page(r.location(), &c.cursor, c.limit),
        )),
        // The node's `changes`: the cursor decoded (any bytes), the caller's
        // scopes' streams read from the replica's log.
        R::Changes(c) => {
            use pangea_core::changes::{self, Cursor, Query, Stream};
            let from = match c.cursor.is_empty() {
                true => Cursor::default(),
                false => Cursor::decode(&c.cursor)?,
            };
            // A decoded cursor encodes back to the same positions.
            assert_eq!(Cursor::decode(&from.encode()).as_ref(), Ok(&from));
            let scopes: Vec<ScopeId> = r.scopes().cloned().collect();
            let streams: Vec<Stream> = scopes
                .iter()
                .filter(|s| may_touch(s).is_ok())
                .filter_map(|s| r.watermarks(s))
                .flat_map(|wm| {
                    let scope = wm.scope.clone();
                    wm.iter()
                        .map(|(o, w)| Stream {
                            scope: scope.clone(),
                            origin: o.clone(),
                            durable: w.sequence,
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            let q = Query {
                table: &c.table,
                prefix: &c.prefix,
                limit: (c.limit as usize).clamp(1, 1_000),
                scan_max: 20_000,
                bytes_max: 4 << 20,
            };
            let page = changes::read(r.storage(), &streams, &from, &q).map_err(|e| e.to_string())?;
            // The node's `register_reader`: loaders only, the name checked and
            // the readers bounded by the replica.
            if !c.reader.is_empty() {
                if !matches!(who, Principal::Loader { .. }) {
                    return Err("registering a reader needs a loader".into());
                }
                r.register_reader(now, &c.reader, from)
                    .map_err(|e| e.to_string())?;
                assert!(r.readers().iter().count() <= changes::READERS_MAX);
            }
            Ok(Response::Changes(page.to_proto()))
        }
        R::PlacementMove(_) | R::Audit(_) | R::Reload(_) | R::Deployment(_) => {
            Err("not mirrored".into())
        }
    }
}

/// A row mutation as the node checks and applies it: its token's bytes.
fn mutate_row(
    r: &mut Replica<MemStorage>,
    who: &Principal,
    now: Now,
    limits: &Limits,
    m: pb::RowMutation,
) -> Result<Bytes, String> {
    let d = r.deployment().clone();
    let may_touch =
        |scope: &ScopeId| auth::authorize_rows(&d, who, scope).map_err(|e| e.to_string());
    auth::check_merge_keys(&m)?;
    let mutation = RowMutation::from_proto(m, limits).map_err(|e| e.to_string())?;
    mutation
        .check_schema(&r.deployment().placement.schema)
        .map_err(|e| e.to_string())?;
    for x in mutation.mutations() {
        if let Mutation::MergeRow(row) = x {
            assert!(
                matches!(who, Principal::Loader { .. }),
                "only loaders get a MergeRow past authorization"
            );
            auth::check_merge(&d, row, now.wall_ms, auth::MergeWindow::DEFAULT)?;
        }
    }
    assert!(
        !mutation.table().starts_with('_'),
        "no identity writes a system table through the data API"
    );
    let scope = scope_here(r, mutation.table(), mutation.row_key())?;
    may_touch(&scope)?;
    let token = r.propose(now, mutation).map_err(|e| e.to_string())?;
    assert_eq!(token.scope, scope, "a write's token names the row's scope");
    r.flush(now).expect("flush on in-memory storage");
    let mut committed = false;
    while let Some(e) = r.poll_event() {
        committed |= e == Event::Committed(token.clone());
    }
    assert!(committed, "a flushed write is committed");
    drive(r, now, &mut Default::default());
    let encoded = token.encode();
    assert_eq!(
        Token::decode(&encoded).as_ref(),
        Ok(&token),
        "a token we issue parses back"
    );
    let wm = r.watermarks(&scope).expect("the replica's own scope");
    assert_eq!(
        decide(&Consistency::Watermark(token), &wm, now.wall_ms),
        Decision::Serve,
        "the replica that took a write covers its token"
    );
    Ok(encoded)
}

fn consistency(c: Option<pb::Consistency>) -> Result<Consistency, String> {
    use pb::consistency::Mode;
    Ok(match c.and_then(|c| c.mode) {
        None | Some(Mode::Eventual(_)) => Consistency::Eventual,
        Some(Mode::RowAffinity(_)) => Consistency::RowAffinity,
        Some(Mode::WatermarkToken(t)) => Consistency::Watermark(
            Token::decode(&t).map_err(|e| format!("consistency token: {e}"))?,
        ),
        Some(Mode::BoundedStalenessMs(ms)) => Consistency::BoundedStaleness { max_ms: ms },
        Some(Mode::AsOfMs(ms)) => Consistency::AsOf { ms },
    })
}

fn filter(f: Option<pb::RowFilter>) -> Result<ReadFilter, String> {
    ReadFilter::from_proto(f.unwrap_or_default()).map_err(|e| e.to_string())
}

fn scope_here(r: &Replica<MemStorage>, table: &str, key: &[u8]) -> Result<ScopeId, String> {
    let d = r.deployment();
    if d.placement.schema.table(table).is_none() {
        return Err(format!("unknown table {table:?}"));
    }
    let scope = r.scope_of(table, key);
    if !d.allowed(r.id(), &scope) {
        return Err("placement forbids".into());
    }
    Ok(scope)
}

fn admit(
    r: &Replica<MemStorage>,
    scope: &ScopeId,
    c: &Consistency,
    now: Now,
) -> Result<ScopeWatermarks, String> {
    let d = r.deployment();
    let of = |s: &ScopeId| {
        r.watermarks(s)
            .unwrap_or_else(|| ScopeWatermarks::new(s.clone()))
    };
    let wm = match c {
        Consistency::Watermark(t) if &t.scope != scope && d.allowed(r.id(), &t.scope) => {
            of(&t.scope)
        }
        _ => of(scope),
    };
    match decide(c, &wm, now.wall_ms) {
        Decision::Serve => Ok(wm),
        other => Err(format!("{other:?}")),
    }
}

fn read_row(
    r: &Replica<MemStorage>,
    table: &str,
    key: &Bytes,
    f: &ReadFilter,
    now: Now,
) -> Result<Option<pb::Row>, String> {
    let row = r.storage().get_row(table, key).map_err(|e| e.to_string())?;
    Ok(row.and_then(|row| {
        row.read(
            key,
            f,
            r.deployment().placement.schema.table(table),
            now.wall_ms,
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness authorizes as the node does: the loader's merge seed is served,
    /// the same frames from a client are refused, an operator reads `_jobs` but no
    /// row.
    #[test]
    fn callers_are_authorized_as_on_a_replica() {
        let seeds = crate::seeds::all();
        let frames_of = |name: &str| {
            let (_, _, data) = seeds
                .iter()
                .find(|(t, n, _)| *t == "client_frame" && n == name)
                .expect("seed exists");
            let mut out = Vec::new();
            let mut stream = &data[1..];
            while let Ok(Some((req, used))) =
                decode_frame::<pb::ClientRequest>(stream, FRAME_BYTES_MAX)
            {
                out.push(req);
                stream = &stream[used..];
            }
            out
        };
        let run = |who: u8, frames: Vec<pb::ClientRequest>| {
            let mut r = Replica::new(
                ReplicaId::from(REPLICA),
                deployment(),
                Config::default(),
                MemStorage::new(),
                7,
                at(0),
            )
            .expect("replica");
            frames
                .into_iter()
                .map(|req| process(&mut r, &principal(who), at(5), req).is_ok())
                .collect::<Vec<_>>()
        };
        // Merge, then a get of the merged row.
        assert_eq!(run(1, frames_of("seed-loader-merge")), [true, true]);
        assert_eq!(run(0, frames_of("seed-loader-merge")), [false, true]);
        assert_eq!(run(2, frames_of("seed-loader-merge")), [false, false]);
        // Watermarks, scan `_jobs`, a forged location entry, a get.
        assert_eq!(
            run(2, frames_of("seed-operator")),
            [true, true, false, false]
        );
        assert_eq!(
            run(0, frames_of("seed-operator")),
            [true, false, false, true]
        );
        assert_eq!(
            run(3, frames_of("seed-operator")),
            [false, false, false, false]
        );
    }
}
