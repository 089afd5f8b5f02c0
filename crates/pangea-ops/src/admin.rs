//! A typed client of a replica's admin endpoint (`pangea_node::admin`): `/health`,
//! `/watermarks`, `/metrics` and the drills' `/fault` routes, over hyper's HTTP/1
//! client, with the body types the server serializes.
//!
//! Calls are blocking (the supervisor, the nemesis and tests call them from plain
//! threads and from inside async tests alike): each runs on a short-lived thread
//! with its own current-thread runtime, bounded by [`CONNECT_TIMEOUT`] and
//! [`RESPONSE_TIMEOUT`].

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
pub use pangea_node::admin::{Health, OriginMark, ScopeMarks, Watermarks};
use std::net::SocketAddr;
use std::time::Duration;

/// Longest wait for the TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Longest wait for the whole response once connected.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong talking to an admin endpoint.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin address {0:?} is not host:port")]
    Address(String, #[source] std::net::AddrParseError),
    #[error("cannot connect to {0}")]
    Connect(SocketAddr, #[source] std::io::Error),
    #[error("{0}: no response within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("{0}: HTTP")]
    Http(SocketAddr, #[source] hyper::Error),
    #[error("{addr}: {method} {path} answered {status}: {body}")]
    Status {
        addr: SocketAddr,
        method: &'static str,
        path: String,
        status: u16,
        body: String,
    },
    #[error("{0}: {1} is not what the endpoint serves")]
    Decode(SocketAddr, &'static str, #[source] serde_json::Error),
    #[error("{0:?} is not a request path")]
    Path(String),
    #[error("cannot run the request")]
    Runtime(#[source] std::io::Error),
}

/// One replica's admin endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admin {
    addr: SocketAddr,
}

/// A response: its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Admin {
    /// The endpoint at `addr` (`host:port`, as a cluster file records it).
    pub fn new(addr: &str) -> Result<Admin, AdminError> {
        let addr = addr
            .parse()
            .map_err(|e| AdminError::Address(addr.to_owned(), e))?;
        Ok(Admin { addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET path`, whatever the status.
    pub fn get(&self, path: &str) -> Result<Answer, AdminError> {
        self.request(Method::GET, path)
    }

    /// `POST path` with no body (the `/fault` routes), whatever the status.
    pub fn post(&self, path: &str) -> Result<Answer, AdminError> {
        self.request(Method::POST, path)
    }

    /// `/health`: whether the replica says it can serve (status 200), and what it
    /// says (its readiness phase while catching up, in `detail`).
    pub fn health(&self) -> Result<(bool, Health), AdminError> {
        let a = self.get("/health")?;
        let health = serde_json::from_str(&a.body)
            .map_err(|e| AdminError::Decode(self.addr, "/health", e))?;
        Ok((a.status == 200, health))
    }

    /// `/watermarks`.
    pub fn watermarks(&self) -> Result<Watermarks, AdminError> {
        let a = self.ok(Method::GET, "/watermarks")?;
        serde_json::from_str(&a.body).map_err(|e| AdminError::Decode(self.addr, "/watermarks", e))
    }

    /// `/metrics`, the OpenMetrics text.
    pub fn metrics(&self) -> Result<String, AdminError> {
        Ok(self.ok(Method::GET, "/metrics")?.body)
    }

    /// A `/fault` change (`POST /fault/ACTION?QUERY`; a replica started with fault
    /// injection only): what the replica now injects.
    pub fn fault(&self, action: &str, query: &str) -> Result<serde_json::Value, AdminError> {
        let path = match query {
            "" => format!("/fault/{action}"),
            q => format!("/fault/{action}?{q}"),
        };
        let a = self.ok(Method::POST, &path)?;
        serde_json::from_str(&a.body).map_err(|e| AdminError::Decode(self.addr, "/fault", e))
    }

    /// A request that must answer 200.
    fn ok(&self, method: Method, path: &str) -> Result<Answer, AdminError> {
        let a = self.request(method.clone(), path)?;
        if a.status != 200 {
            return Err(AdminError::Status {
                addr: self.addr,
                method: if method == Method::POST {
                    "POST"
                } else {
                    "GET"
                },
                path: path.to_owned(),
                status: a.status,
                body: a.body.trim().to_owned(),
            });
        }
        Ok(a)
    }

    fn request(&self, method: Method, path: &str) -> Result<Answer, AdminError> {
        let (addr, path) = (self.addr, path.to_owned());
        std::thread::scope(|s| {
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(AdminError::Runtime)?;
                rt.block_on(request(addr, method, &path))
            })
            .join()
            .unwrap_or_else(|_| {
                Err(AdminError::Runtime(std::io::Error::other(
                    "the request's thread panicked",
                )))
            })
        })
    }
}

async fn request(addr: SocketAddr, method: Method, path: &str) -> Result<Answer, AdminError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| AdminError::Timeout(addr, CONNECT_TIMEOUT))?
        .map_err(|e| AdminError::Connect(addr, e))?;
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| AdminError::Http(addr, e))?;
        let conn = tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|_| AdminError::Path(path.to_owned()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| AdminError::Http(addr, e))?;
        let status: StatusCode = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| AdminError::Http(addr, e))?
            .to_bytes();
        conn.abort();
        Ok(Answer {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(RESPONSE_TIMEOUT, exchange)
        .await
        .map_err(|_| AdminError::Timeout(addr, RESPONSE_TIMEOUT))?
}
