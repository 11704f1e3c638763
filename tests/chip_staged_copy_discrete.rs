//! The `chip_staged_copy` suite with every chip a [`DiscreteSim`](simpler::chip::DiscreteSim): device
//! memory the host cannot read (see `common::builder`).

#[path = "chip_staged_copy.rs"]
mod suite;
