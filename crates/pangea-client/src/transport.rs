//! Connections to replicas (one per replica, reused, re-established when lost) and
//! one request on one QUIC stream.

use crate::{ClientConfig, Error};
use dashmap::DashMap;
use pangea_net::reload::{LiveTls, RELOAD_INTERVAL_DEFAULT, TlsFiles, spawn_poller};
use pangea_net::{FRAME_BYTES_MAX, PeerIdentity, read_frame, tls, write_frame};
use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

pub(crate) struct Transport {
    endpoint: quinn::Endpoint,
    addresses: BTreeMap<ReplicaId, SocketAddr>,
    connections: DashMap<ReplicaId, quinn::Connection>,
    /// The client certificate, trust bundle and CRL: re-read when they change
    /// (polled every 30 s), so new connections present a re-issued certificate and
    /// refuse revoked replicas without restarting the frontend. Held here because
    /// the poller stops once it is dropped.
    _tls: std::sync::Arc<LiveTls>,
}

impl Transport {
    pub(crate) fn new(config: &ClientConfig) -> Result<Transport, Error> {
        let live = LiveTls::load(TlsFiles::client(&config.certs, &config.client_name)?)?;
        let client = live.client_config()?;
        spawn_poller(&live, RELOAD_INTERVAL_DEFAULT, |_| {})?;
        let wan = (config.emulate_wan || config.wan.is_some()).then(|| {
            let control = config.wan.clone().unwrap_or_default();
            if config.emulate_wan {
                // Replicas do not delay answers to clients: this side carries the
                // whole round trip from the client's region.
                for (r, addr) in &config.addresses {
                    let rtt_ms =
                        pangea_core::read::estimated_rtt_ms(&config.deployment, &config.region, r);
                    if rtt_ms.is_finite() {
                        control.set_delay(*addr, Duration::from_micros((rtt_ms * 1_000.0) as u64));
                    }
                }
            }
            pangea_net::wan::WanEmulator::new(control, 1)
        });
        let bind: SocketAddr = ([127, 0, 0, 1], 0).into();
        let any = config.addresses.values().any(|a| !a.ip().is_loopback());
        let bind = if any {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            bind
        };
        let endpoint = pangea_net::bind_endpoint(bind, None, client, wan, None)?;
        Ok(Transport {
            endpoint,
            addresses: config.addresses.clone(),
            connections: DashMap::new(),
            _tls: live,
        })
    }

    async fn connection(&self, replica: &ReplicaId) -> Result<quinn::Connection, Error> {
        if let Some(c) = self.connections.get(replica).map(|c| c.clone())
            && c.close_reason().is_none()
        {
            return Ok(c);
        }
        let addr = *self
            .addresses
            .get(replica)
            .ok_or_else(|| Error::Unavailable(format!("no address for replica {replica}")))?;
        let connecting = self
            .endpoint
            .connect(addr, tls::server_name(replica.as_str()))
            .map_err(|e| Error::Unavailable(format!("replica {replica} at {addr}: {e}")))?;
        let c = connecting
            .await
            .map_err(|e| Error::Unavailable(format!("replica {replica} at {addr}: {e}")))?;
        match pangea_net::peer_identity(&c)? {
            PeerIdentity::Replica { id, .. } if id == replica.as_str() => {}
            other => {
                return Err(Error::Unavailable(format!(
                    "{addr} presented {other}, expected replica {replica}"
                )));
            }
        }
        self.connections.insert(replica.clone(), c.clone());
        Ok(c)
    }

    /// Drops the cached connection to a replica (it looks dead); the next call
    /// connects afresh.
    pub(crate) fn forget(&self, replica: &ReplicaId) {
        if let Some((_, c)) = self.connections.remove(replica) {
            c.close(0u32.into(), b"replica unresponsive");
        }
    }

    /// One request, one stream, one response.
    pub(crate) async fn call(
        &self,
        replica: &ReplicaId,
        req: &pb::ClientRequest,
    ) -> Result<pb::ClientResponse, Error> {
        let cached = self
            .connections
            .get(replica)
            .is_some_and(|c| c.close_reason().is_none());
        match self.call_once(replica, req).await {
            // A cached connection can be dead without knowing it yet (its process was
            // killed and restarted): once, forget it and try a fresh one.
            Err(Error::Unavailable(_)) if cached => {
                self.forget(replica);
                self.call_once(replica, req).await
            }
            other => other,
        }
    }

    async fn call_once(
        &self,
        replica: &ReplicaId,
        req: &pb::ClientRequest,
    ) -> Result<pb::ClientResponse, Error> {
        let c = self.connection(replica).await?;
        let lost =
            |e: &dyn std::fmt::Display| Error::Unavailable(format!("replica {replica}: {e}"));
        let (mut send, mut recv) = match c.open_bi().await {
            Ok(s) => s,
            Err(e) => {
                self.connections.remove(replica);
                return Err(lost(&e));
            }
        };
        write_frame(&mut send, req).await.map_err(|e| lost(&e))?;
        let _ = send.finish();
        match read_frame::<pb::ClientResponse>(&mut recv, FRAME_BYTES_MAX).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(lost(&"closed the stream without an answer")),
            Err(e) => {
                if c.close_reason().is_some() {
                    self.connections.remove(replica);
                }
                Err(lost(&e))
            }
        }
    }
}
