//! The deployment as data.
//!
//! Operators describe a Pangea deployment in two files: a topology (continents,
//! regions, replicas, links, app profiles) and a placement (tables, families, GC
//! policies, placement policies and rules). Every replica, the client library and the
//! simulator read them through this crate.
//!
//! Modules:
//! - [`schema`]: tables, column families and their garbage-collection policies, the
//!   part of the placement file the data model needs.

pub mod schema;
