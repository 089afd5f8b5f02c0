//! Pangea's wire schema, generated at build time from `proto/pangea/v1/*.proto`.
//!
//! - `data.proto`: cells, mutations, rows and the replicated row state;
//! - `client.proto`: requests and responses between `pangea-client` and a replica;
//! - `replication.proto`: frames between replicas;
//! - `ad_profile.proto`: the example `AdProfile` an ad frontend stores.
//!
//! Decoding untrusted bytes: callers check a frame's length against their limit
//! before handing it to `prost::Message::decode`, which itself never panics.

#![allow(unreachable_pub, missing_debug_implementations, clippy::all)]

/// Version 1 of the schema.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/pangea.v1.rs"));
}

pub use prost::{self, Message};

/// The replication protocol version carried in `Hello`; replicas of different
/// versions refuse each other. 2: heartbeats condensed per stream (`HeartbeatBatch`).
pub const PROTOCOL_VERSION: u32 = 2;

#[cfg(test)]
mod tests {
    use super::v1::*;
    use super::*;

    /// What a replica writes from a pre-encoded row decodes, on the client, as the
    /// response it would have built.
    #[test]
    fn an_encoded_get_decodes_as_the_client_response() {
        let row = Row {
            key: "user-1".into(),
            families: vec![FamilyCells {
                name: "profile".into(),
                cells: vec![Cell {
                    column: "p".into(),
                    timestamp: 42,
                    origin: "us-east1-a".into(),
                    value: vec![7u8; 1024].into(),
                }],
            }],
        };
        let watermarks = ScopeWatermarks {
            scope: "global".into(),
            origins: vec![OriginWatermark {
                origin: "us-east1-a".into(),
                sequence: 7,
                timestamp: 42,
                vouched: 0,
            }],
            low_watermark: 42,
            freshness: 42,
        };
        let served_by = Some(ServedBy {
            replica: "us-east1-a".into(),
            region: "us-east1".into(),
            watermarks: Some(watermarks.clone()),
            deployment: 0x5eed,
            watermarks_digest: 0xd16e57,
        });
        let served_by_encoded = Some(ServedByEncoded {
            replica: "us-east1-a".into(),
            region: "us-east1".into(),
            watermarks: Some(watermarks.encode_to_vec().into()),
            deployment: 0x5eed,
            watermarks_digest: 0xd16e57,
        });
        for row in [Some(row), None] {
            let encoded = ClientResponseEncodedGet {
                served_by: served_by_encoded.clone(),
                get: Some(GetResponseEncoded {
                    row: row.as_ref().map(|r| r.encode_to_vec().into()),
                }),
            };
            let built = ClientResponse {
                served_by: served_by.clone(),
                response: Some(client_response::Response::Get(GetResponse { row })),
            };
            let decoded = ClientResponse::decode(encoded.encode_to_vec().as_slice());
            assert_eq!(decoded.ok(), Some(built.clone()));
            assert_eq!(encoded.encode_to_vec(), built.encode_to_vec());
        }
    }
}
