//! The `l2_worker` suite with every chip a [`DiscreteSim`](simpler::chip::DiscreteSim): device
//! memory the host cannot read (see `common::builder`).

#[path = "l2_worker.rs"]
mod suite;
