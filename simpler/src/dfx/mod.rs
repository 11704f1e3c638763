//! Observability: DAG capture and export, run statistics.

pub(crate) mod graph;
pub(crate) mod timeline;
