//! `CallConfig`: the small plain-old-data execution knobs that travel by value with every task.

use crate::error::{Error, Result};

/// Number of scope-depth rings a [`RuntimeEnv`] has an entry for.
///
/// ```
/// use simpler::{RING_DEPTH, RuntimeEnv};
/// let env = RuntimeEnv::default();
/// assert_eq!(env.ring_task_window.len(), RING_DEPTH);
/// assert_eq!(env.ring_heap.len(), RING_DEPTH);
/// ```
pub const RING_DEPTH: usize = 4;

/// Size of [`CallConfig::output_prefix`] in bytes; the prefix itself holds at most one byte
/// less (it is NUL-terminated).
///
/// ```
/// use simpler::{CallConfig, OUTPUT_PREFIX_LEN};
/// let mut cfg = CallConfig::default();
/// assert!(cfg.set_output_prefix(&"d".repeat(OUTPUT_PREFIX_LEN - 1)).is_ok());
/// assert!(cfg.set_output_prefix(&"d".repeat(OUTPUT_PREFIX_LEN)).is_err());
/// ```
pub const OUTPUT_PREFIX_LEN: usize = 1024;

/// Per-run ring sizing overrides, one entry per scope-depth ring; 0 means "unset".
///
/// ```
/// use simpler::{CallConfig, RuntimeEnv};
/// let env = RuntimeEnv { ring_heap: [1 << 20; 4], ..RuntimeEnv::default() };
/// assert_eq!(env.ring_heap[3], 1 << 20);
/// assert_eq!(env.ring_task_window, [0; 4]); // unset
///
/// // Checked as part of the CallConfig that carries it.
/// let mut cfg = CallConfig { runtime_env: env, ..CallConfig::default() };
/// assert!(cfg.validate().is_ok());
/// cfg.runtime_env.ring_task_window[0] = 100; // not a power of two
/// assert!(cfg.validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct RuntimeEnv {
    /// Task window per ring: a power of two in `[4, i32::MAX]`, or 0.
    pub ring_task_window: [u64; RING_DEPTH],
    /// Heap bytes per ring: at least 1024, or 0.
    pub ring_heap: [u64; RING_DEPTH],
    /// Dependency pool entries per ring: in `[4, i32::MAX]`, or 0.
    pub ring_dep_pool: [u64; RING_DEPTH],
}

/// Execution knobs of a task: identical at every level, copied by value.
///
/// ```
/// use simpler::CallConfig;
/// let mut cfg = CallConfig::default();
/// cfg.aicpu_thread_num = 4;
/// assert!(cfg.validate().is_ok());
/// cfg.enable_pmu = 1; // diagnostics need an output prefix
/// assert!(cfg.validate().is_err());
/// cfg.set_output_prefix("/tmp/pmu").unwrap();
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct CallConfig {
    /// Scheduler threads on the chip; 0 = the default, otherwise at least 2.
    pub aicpu_thread_num: i32,
    /// Swimlane profiling level, 0..=4.
    pub enable_chip_swimlane: i32,
    /// Dump task arguments (diagnostic).
    pub enable_dump_args: i32,
    /// PMU event type; 0 = off (diagnostic).
    pub enable_pmu: i32,
    /// Dependency-graph generation (diagnostic).
    pub enable_dep_gen: i32,
    /// Scope statistics (diagnostic).
    pub enable_scope_stats: i32,
    /// Ring sizing overrides.
    pub runtime_env: RuntimeEnv,
    /// NUL-padded directory for diagnostic output; required when any diagnostic flag is set.
    pub output_prefix: [u8; OUTPUT_PREFIX_LEN],
}

impl Default for CallConfig {
    fn default() -> CallConfig {
        CallConfig::DEFAULT
    }
}

impl CallConfig {
    /// The default configuration (everything 0 / empty), as a constant.
    ///
    /// ```
    /// use simpler::CallConfig;
    /// assert_eq!(CallConfig::DEFAULT, CallConfig::default());
    /// ```
    pub const DEFAULT: CallConfig = CallConfig {
        aicpu_thread_num: 0,
        enable_chip_swimlane: 0,
        enable_dump_args: 0,
        enable_pmu: 0,
        enable_dep_gen: 0,
        enable_scope_stats: 0,
        runtime_env: RuntimeEnv {
            ring_task_window: [0; RING_DEPTH],
            ring_heap: [0; RING_DEPTH],
            ring_dep_pool: [0; RING_DEPTH],
        },
        output_prefix: [0; OUTPUT_PREFIX_LEN],
    };
}

impl std::fmt::Debug for CallConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallConfig")
            .field("aicpu_thread_num", &self.aicpu_thread_num)
            .field("enable_chip_swimlane", &self.enable_chip_swimlane)
            .field("enable_dump_args", &self.enable_dump_args)
            .field("enable_pmu", &self.enable_pmu)
            .field("enable_dep_gen", &self.enable_dep_gen)
            .field("enable_scope_stats", &self.enable_scope_stats)
            .field("runtime_env", &self.runtime_env)
            .field("output_prefix", &self.output_prefix())
            .finish()
    }
}

impl CallConfig {
    /// The output prefix as a string (up to the first NUL); empty when unset.
    ///
    /// ```
    /// use simpler::CallConfig;
    /// let mut cfg = CallConfig::default();
    /// assert_eq!(cfg.output_prefix(), "");
    /// cfg.set_output_prefix("/tmp/trace").unwrap();
    /// assert_eq!(cfg.output_prefix(), "/tmp/trace");
    /// ```
    pub fn output_prefix(&self) -> &str {
        let end = self.output_prefix.iter().position(|&b| b == 0).unwrap_or(OUTPUT_PREFIX_LEN);
        std::str::from_utf8(&self.output_prefix[..end]).unwrap_or("")
    }

    /// Sets the output prefix, replacing any earlier one; at most 1023 bytes, no NUL.
    ///
    /// # Errors
    ///
    /// A prefix of [`OUTPUT_PREFIX_LEN`] bytes or more, or one holding a NUL byte, is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error; the old prefix
    /// stays.
    ///
    /// ```
    /// use simpler::CallConfig;
    /// let mut cfg = CallConfig::default();
    /// cfg.set_output_prefix("/tmp/a-long-first-prefix").unwrap();
    /// cfg.set_output_prefix("/tmp/b").unwrap();
    /// assert_eq!(cfg.output_prefix(), "/tmp/b");
    /// assert!(cfg.set_output_prefix("bad\0prefix").is_err());
    /// assert_eq!(cfg.output_prefix(), "/tmp/b");
    /// ```
    pub fn set_output_prefix(&mut self, prefix: &str) -> Result<()> {
        if prefix.len() >= OUTPUT_PREFIX_LEN || prefix.as_bytes().contains(&0) {
            return Err(Error::invalid(format!(
                "CallConfig.output_prefix must be under {OUTPUT_PREFIX_LEN} bytes with no NUL"
            )));
        }
        self.output_prefix = [0; OUTPUT_PREFIX_LEN];
        self.output_prefix[..prefix.len()].copy_from_slice(prefix.as_bytes());
        Ok(())
    }

    fn any_diagnostics(&self) -> bool {
        self.enable_chip_swimlane != 0
            || self.enable_dump_args != 0
            || self.enable_pmu != 0
            || self.enable_dep_gen != 0
            || self.enable_scope_stats != 0
    }

    /// Checks every field; run at every submit.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error naming the first
    /// bad field: `aicpu_thread_num` of 1 or negative, `enable_chip_swimlane` outside `0..=4`, a
    /// negative diagnostic flag, a diagnostic flag without an output prefix, or a
    /// [`RuntimeEnv`] entry out of its range.
    ///
    /// ```
    /// use simpler::CallConfig;
    /// assert!(CallConfig::default().validate().is_ok());
    /// let cfg = CallConfig { aicpu_thread_num: 1, ..CallConfig::default() };
    /// assert!(cfg.validate().unwrap_err().message().contains("aicpu_thread_num"));
    /// let cfg = CallConfig { enable_chip_swimlane: 5, ..CallConfig::default() };
    /// assert!(cfg.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.aicpu_thread_num < 0 || self.aicpu_thread_num == 1 {
            return Err(Error::invalid(format!(
                "CallConfig.aicpu_thread_num must be 0 (default) or >= 2, got {}",
                self.aicpu_thread_num
            )));
        }
        if !(0..=4).contains(&self.enable_chip_swimlane) {
            return Err(Error::invalid(format!(
                "CallConfig.enable_chip_swimlane must be in 0..=4, got {}",
                self.enable_chip_swimlane
            )));
        }
        for (name, v) in [
            ("enable_dump_args", self.enable_dump_args),
            ("enable_pmu", self.enable_pmu),
            ("enable_dep_gen", self.enable_dep_gen),
            ("enable_scope_stats", self.enable_scope_stats),
        ] {
            if v < 0 {
                return Err(Error::invalid(format!("CallConfig.{name} must be >= 0, got {v}")));
            }
        }
        if self.any_diagnostics() && self.output_prefix().is_empty() {
            return Err(Error::invalid("CallConfig.output_prefix is required when a diagnostic flag is set"));
        }
        let max = i32::MAX as u64;
        for (i, &w) in self.runtime_env.ring_task_window.iter().enumerate() {
            if w != 0 && (!w.is_power_of_two() || !(4..=max).contains(&w)) {
                return Err(Error::invalid(format!(
                    "CallConfig.runtime_env.ring_task_window[{i}] must be 0 or a power of two in [4, {max}], got {w}"
                )));
            }
        }
        for (i, &h) in self.runtime_env.ring_heap.iter().enumerate() {
            if h != 0 && h < 1024 {
                return Err(Error::invalid(format!(
                    "CallConfig.runtime_env.ring_heap[{i}] must be 0 or >= 1024, got {h}"
                )));
            }
        }
        for (i, &d) in self.runtime_env.ring_dep_pool.iter().enumerate() {
            if d != 0 && !(4..=max).contains(&d) {
                return Err(Error::invalid(format!(
                    "CallConfig.runtime_env.ring_dep_pool[{i}] must be 0 or in [4, {max}], got {d}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        CallConfig::default().validate().unwrap();
    }

    #[test]
    fn rejects_bad_fields() {
        let mut c = CallConfig { aicpu_thread_num: 1, ..CallConfig::default() };
        assert!(c.validate().is_err());
        c.aicpu_thread_num = 0;
        c.runtime_env.ring_task_window[2] = 6;
        assert!(c.validate().unwrap_err().message().contains("ring_task_window[2]"));
        c.runtime_env.ring_task_window[2] = 8;
        c.runtime_env.ring_heap[0] = 10;
        assert!(c.validate().is_err());
    }
}
