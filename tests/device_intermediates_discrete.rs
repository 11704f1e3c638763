//! The `device_intermediates` suite with every chip a [`DiscreteSim`](simpler::chip::DiscreteSim): device
//! memory the host cannot read (see `common::builder`).

#[path = "device_intermediates.rs"]
mod suite;
