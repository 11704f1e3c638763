//! The `chips` suite with every chip a [`DiscreteSim`](simpler::chip::DiscreteSim): device
//! memory the host cannot read (see `common::builder`).

#[path = "chips.rs"]
mod suite;
