//! The `chip_pipelining` suite with every chip a [`DiscreteSim`](simpler::chip::DiscreteSim): device
//! memory the host cannot read (see `common::builder`).

#[path = "chip_pipelining.rs"]
mod suite;
