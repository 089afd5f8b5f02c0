//! Change streams (`Client::read_changes`): the committed mutations of a table,
//! or of a key prefix of it, a page at a time, each origin's in its order, from
//! a cursor the reader keeps. docs/client.md, "Change streams".
//!
//! Delivery is at least once: a reader that saves the cursor after handling a
//! page and resumes from it after a crash sees again only what it had not
//! saved, each change named by (scope, origin, sequence). The cursor is
//! portable: any replica holding the same scopes continues from it.

use crate::trace::Op;
use crate::{Client, Error, ReadOptions, Response};
use bytes::Bytes;
use pangea_proto::v1 as pb;

/// Where a change stream starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangesFrom {
    /// After everything written so far: changes from now on.
    Now,
    /// At the oldest change the replica keeps (the table's `changes.retention`).
    Earliest,
    /// Where a previous page's [`ChangesPage::cursor`] left off.
    Cursor(Bytes),
}

impl ChangesFrom {
    /// The request's `cursor` and `from_earliest`.
    fn request(&self) -> (Bytes, bool) {
        match self {
            ChangesFrom::Now => (Bytes::new(), false),
            ChangesFrom::Earliest => (Bytes::new(), true),
            ChangesFrom::Cursor(c) => (c.clone(), false),
        }
    }
}

/// A replica's answer, its changes checked as any write's.
fn page_of(c: pb::ChangesResponse) -> Result<ChangesPage, Error> {
    let limits = pangea_core::Limits::default();
    Ok(ChangesPage {
        changes: c
            .changes
            .into_iter()
            .map(|ch| Change::from_proto(ch, &limits))
            .collect::<Result<_, _>>()?,
        cursor: c.cursor,
        more: c.more,
    })
}

/// One committed mutation (`pangea_core::changes::Change`).
pub use pangea_core::changes::Change;

/// A page of a change stream.
#[derive(Debug, Clone, Default)]
pub struct ChangesPage {
    /// Each origin's changes in its order.
    pub changes: Vec<Change>,
    /// Pass as [`ChangesFrom::Cursor`] for the next page (save it once the
    /// page is handled).
    pub cursor: Bytes,
    /// More follows at once; otherwise the stream is caught up (ask again later).
    pub more: bool,
}

impl Client {
    /// One page of `table`'s change stream under `prefix` (empty: the whole
    /// table), at most `limit` changes (0: the replica's most, 1,000), from the
    /// nearest replica the app profile may read (another if it fails, or if its
    /// log no longer holds what follows the cursor). Only scopes the app
    /// profile may read are in it. The table must have a change stream
    /// (`changes = { retention = "24h" }` in the placement file).
    pub async fn read_changes(
        &self,
        table: &str,
        prefix: impl Into<Bytes>,
        from: &ChangesFrom,
        limit: u32,
        opts: &ReadOptions,
    ) -> Result<Response<ChangesPage>, Error> {
        self.read_changes_as("", table, prefix, from, limit, opts)
            .await
    }

    /// [`Client::read_changes`] as the registered reader `reader` (empty: none):
    /// the replica that answers keeps its log after `from` (what the reader
    /// has handled) past the tables' retention, while the reader comes back
    /// within a week (docs/client.md, "Registered readers"). Needs a loader
    /// certificate.
    pub async fn read_changes_as(
        &self,
        reader: &str,
        table: &str,
        prefix: impl Into<Bytes>,
        from: &ChangesFrom,
        limit: u32,
        opts: &ReadOptions,
    ) -> Result<Response<ChangesPage>, Error> {
        let prefix = prefix.into();
        let (cursor, from_earliest) = from.request();
        let req = pb::client_request::Request::Changes(pb::ChangesRequest {
            table: table.to_owned(),
            prefix: prefix.clone(),
            cursor,
            from_earliest,
            limit,
            reader: reader.to_owned(),
        });
        let r = self.read(Op::Changes, table, &prefix, 1, req, opts).await?;
        r.map(|resp| match resp {
            pb::client_response::Response::Changes(c) => page_of(c),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        })
    }
}

impl Client {
    /// One page of `table`'s change stream under `prefix` answered by `replica`
    /// alone, from `from`, as the registered reader `reader` (empty: none): no
    /// routing or failover. For
    /// tools that read one replica's cut, such as backups (`pangea backup
    /// create`), and readers that keep to the replica holding their log;
    /// consumers use [`Client::read_changes`].
    #[allow(clippy::too_many_arguments)]
    pub async fn read_changes_at(
        &self,
        replica: &pangea_core::ReplicaId,
        reader: &str,
        table: &str,
        prefix: Bytes,
        from: &ChangesFrom,
        limit: u32,
        deadline: std::time::Duration,
    ) -> Result<ChangesPage, Error> {
        let (cursor, from_earliest) = from.request();
        let req = pb::ClientRequest {
            deadline_us: deadline.as_micros() as u64,
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::Changes(pb::ChangesRequest {
                table: table.to_owned(),
                prefix,
                cursor,
                from_earliest,
                limit,
                reader: reader.to_owned(),
            })),
        };
        let call = self.inner.transport.call(replica, &req);
        let resp = match tokio::time::timeout(deadline, call).await {
            Err(_) => {
                return Err(Error::DeadlineExceeded {
                    deadline,
                    attempts: 1,
                });
            }
            Ok(resp) => resp?,
        };
        match resp.response {
            Some(pb::client_response::Response::Changes(c)) => page_of(c),
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, replica)),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        }
    }
}
