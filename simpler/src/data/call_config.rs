//! `CallConfig`: the execution knobs that travel with every next-level task, as a Rust-shaped
//! builder. The wire codec (`data/wire.rs`) maps it to and from the packed 1144-byte C layout
//! that upstream passes by value; that layout appears nowhere else.
//!
//! Its knobs are `bool`s, a `Swimlane`, `Option`s and `RingSizes`. Most matter only on real
//! hardware; the diagnostics ones (swimlane, arguments, DAG, scope counters) the simulated chip
//! writes too (`chip::diag`). A config is validated at every submit.

use crate::error::{Error, Result};

/// Number of scope-depth rings a config has sizes for (the wire layout's arrays).
pub(crate) const RING_DEPTH: usize = 4;

/// Bytes of the wire layout's NUL-padded output prefix; the prefix itself holds at most one byte
/// less.
pub(crate) const OUTPUT_PREFIX_LEN: usize = 1024;

/// Sizes of one scope-depth ring on the chip's runtime; `None` keeps the runtime's own size.
///
/// Only real hardware sizes its rings by these (upstream's `tensormap_and_ringbuffer` runtime);
/// the simulated chip checks them and otherwise ignores them.
///
/// ```
/// use simpler::{chip::CallConfig, chip::RingSizes};
/// let small = RingSizes { task_window: Some(16), heap_bytes: Some(64 << 10), dep_pool: Some(64) };
/// assert!(CallConfig::new().rings(small).validate().is_ok());
/// let bad = RingSizes { task_window: Some(100), ..RingSizes::default() }; // not a power of two
/// assert!(CallConfig::new().ring(2, bad).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingSizes {
    /// Task window: a power of two in `[4, i32::MAX]`.
    pub task_window: Option<u64>,
    /// Heap bytes: at least 1024.
    pub heap_bytes: Option<u64>,
    /// Dependency pool entries: in `[4, i32::MAX]`.
    pub dep_pool: Option<u64>,
}

/// Swimlane profiling on the chip (upstream's perf level `0..=4`). On the simulated chip any
/// level on writes the chip task's per-core timeline under the output prefix
/// (`chip<N>-<pid>-<callable>-<K>.swimlane.json`, a Chrome trace, and `.swimlane.svg`); the levels
/// differ only on hardware.
///
/// ```
/// use simpler::{chip::CallConfig, chip::Swimlane};
/// let cfg = CallConfig::new().swimlane(Swimlane::Level2).output_prefix("/tmp/trace");
/// assert_eq!(cfg.get_swimlane(), Swimlane::Level2);
/// assert_eq!(Swimlane::default(), Swimlane::Off);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Swimlane {
    /// No swimlane profiling.
    #[default]
    Off,
    /// Perf level 1.
    Level1,
    /// Perf level 2.
    Level2,
    /// Perf level 3.
    Level3,
    /// Perf level 4.
    Level4,
}

impl Swimlane {
    /// The upstream perf level, `0..=4`.
    pub(crate) fn level(self) -> i32 {
        self as i32
    }

    /// The swimlane of upstream perf level `level`, if it is one.
    pub(crate) fn from_level(level: i32) -> Option<Swimlane> {
        [Swimlane::Off, Swimlane::Level1, Swimlane::Level2, Swimlane::Level3, Swimlane::Level4]
            .get(usize::try_from(level).ok()?)
            .copied()
    }
}

/// Execution knobs of one next-level task (a chip callable, or an orchestration on a nested
/// Worker): built with chained setters, checked at every submit, identical at every level.
///
/// **Which knobs do anything.** Every knob here is read by upstream's chip runtime on real
/// hardware: the AICPU scheduler thread count, the ring sizes, and the diagnostics (swimlane,
/// argument dumps, PMU, dependency-graph generation, scope statistics, all written under the
/// output prefix). The simulated chip ([`SimChip`](crate::chip::SimChip)) checks the config, carries it
/// to the chip, hands it to a chip orchestration (`ChipFn::orchestration`), and writes the
/// diagnostics into the folder the output prefix names, one set of files per chip task,
/// `chip<N>-<pid>-<callable>-<K>.*`: [`swimlane`](CallConfig::swimlane) the per-core timeline
/// (`.swimlane.json`, a Chrome trace, and `.swimlane.svg`), [`dump_args`](CallConfig::dump_args)
/// the decoded arguments of each task (`.args.txt`), [`dep_gen`](CallConfig::dep_gen) the DAG the
/// chip orchestration built (`.deps.dot`), [`scope_stats`](CallConfig::scope_stats) each scope's
/// tasks and allocations (`.scopes.txt`). The thread count, rings and PMU event matter only on
/// hardware: results never depend on the config. A diagnostic that cannot be written fails the
/// task, saying so. SUB tasks take no config.
///
/// ```
/// use simpler::{chip::CallConfig, chip::RingSizes};
/// let cfg = CallConfig::new()
///     .aicpu_threads(4)
///     .rings(RingSizes { heap_bytes: Some(1 << 20), ..RingSizes::default() })
///     .scope_stats(true)
///     .output_prefix("/tmp/stats");
/// assert!(cfg.validate().is_ok());
/// // A diagnostic needs somewhere to write.
/// assert!(CallConfig::new().dump_args(true).validate().is_err());
/// assert_eq!(CallConfig::new(), CallConfig::default());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallConfig {
    aicpu_threads: Option<u32>,
    swimlane: Swimlane,
    dump_args: bool,
    pmu_event: Option<u32>,
    dep_gen: bool,
    scope_stats: bool,
    /// `None`: no ring overrides (boxed: most configs have none, and a config stays small).
    rings: Option<Box<[RingSizes; RING_DEPTH]>>,
    output_prefix: Option<Box<str>>,
}

impl CallConfig {
    /// The default configuration: the runtime's own defaults, no diagnostics.
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new();
    /// assert_eq!(cfg.get_aicpu_threads(), None);
    /// assert!(!cfg.get_dump_args());
    /// ```
    pub const fn new() -> CallConfig {
        CallConfig {
            aicpu_threads: None,
            swimlane: Swimlane::Off,
            dump_args: false,
            pmu_event: None,
            dep_gen: false,
            scope_stats: false,
            rings: None,
            output_prefix: None,
        }
    }

    /// AICPU scheduler threads on the chip (upstream `aicpu_thread_num`): at least 2; 0 restores
    /// the architecture's default (4 on a2a3, 5 on a5). Real hardware only.
    ///
    /// ```
    /// use simpler::chip::CallConfig;
    /// assert_eq!(CallConfig::new().aicpu_threads(4).get_aicpu_threads(), Some(4));
    /// assert_eq!(CallConfig::new().aicpu_threads(4).aicpu_threads(0), CallConfig::new());
    /// assert!(CallConfig::new().aicpu_threads(1).validate().is_err()); // too few
    /// ```
    pub fn aicpu_threads(mut self, threads: u32) -> CallConfig {
        self.aicpu_threads = (threads != 0).then_some(threads);
        self
    }

    /// Swimlane profiling level (diagnostic; needs an [`output_prefix`](CallConfig::output_prefix)).
    /// Real hardware only.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::Swimlane};
    /// assert!(CallConfig::new().swimlane(Swimlane::Level1).validate().is_err()); // no prefix
    /// ```
    pub fn swimlane(mut self, level: Swimlane) -> CallConfig {
        self.swimlane = level;
        self
    }

    /// Dumps the decoded arguments of each task the chip runs for this task (diagnostic; needs an
    /// output prefix): `chip<N>-<pid>-<callable>-<K>.args.txt` there.
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new().dump_args(true).output_prefix("/tmp/args");
    /// assert!(cfg.get_dump_args() && cfg.validate().is_ok());
    /// ```
    pub fn dump_args(mut self, on: bool) -> CallConfig {
        self.dump_args = on;
        self
    }

    /// Records PMU event type `event` (diagnostic; needs an output prefix); 0 turns PMU
    /// recording off. Real hardware only.
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new().pmu_event(2).output_prefix("/tmp/pmu");
    /// assert_eq!(cfg.get_pmu_event(), Some(2));
    /// assert_eq!(cfg.pmu_event(0).get_pmu_event(), None);
    /// ```
    pub fn pmu_event(mut self, event: u32) -> CallConfig {
        self.pmu_event = (event != 0).then_some(event);
        self
    }

    /// Writes the DAG a chip orchestration built, with each kernel's core and times
    /// (diagnostic; needs an output prefix): `chip<N>-<pid>-<callable>-<K>.deps.dot` there.
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new().dep_gen(true).output_prefix("/tmp/deps");
    /// assert!(cfg.get_dep_gen());
    /// ```
    pub fn dep_gen(mut self, on: bool) -> CallConfig {
        self.dep_gen = on;
        self
    }

    /// Writes each scope's counters of a chip orchestration (depth, tasks, allocations;
    /// diagnostic; needs an output prefix): `chip<N>-<pid>-<callable>-<K>.scopes.txt` there.
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new().scope_stats(true).output_prefix("/tmp/stats");
    /// assert!(cfg.get_scope_stats());
    /// ```
    pub fn scope_stats(mut self, on: bool) -> CallConfig {
        self.scope_stats = on;
        self
    }

    /// Sets the sizes of every scope-depth ring to `sizes`. Real hardware only.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::RingSizes};
    /// let sizes = RingSizes { dep_pool: Some(4096), ..RingSizes::default() };
    /// let cfg = CallConfig::new().rings(sizes);
    /// assert!((0..4).all(|d| cfg.get_ring(d) == sizes));
    /// ```
    pub fn rings(mut self, sizes: RingSizes) -> CallConfig {
        self.rings = Some(Box::new([sizes; RING_DEPTH]));
        self
    }

    /// Sets the sizes of the ring of scope depth `depth` (`0..4`; deeper scopes share ring 3).
    /// Real hardware only.
    ///
    /// # Panics
    ///
    /// When `depth` is 4 or more.
    ///
    /// ```
    /// use simpler::{chip::CallConfig, chip::RingSizes};
    /// let big = RingSizes { heap_bytes: Some(16 << 20), ..RingSizes::default() };
    /// let cfg = CallConfig::new().ring(0, big);
    /// assert_eq!(cfg.get_ring(0), big);
    /// assert_eq!(cfg.get_ring(1), RingSizes::default());
    /// ```
    pub fn ring(mut self, depth: usize, sizes: RingSizes) -> CallConfig {
        assert!(depth < RING_DEPTH, "CallConfig::ring: depth {depth} is not below {RING_DEPTH}");
        self.rings.get_or_insert_with(Default::default)[depth] = sizes;
        self
    }

    /// Directory for diagnostic output: required when any diagnostic is on; under 1024 bytes,
    /// no NUL (checked by [`validate`](CallConfig::validate)).
    ///
    /// ```
    /// let cfg = simpler::chip::CallConfig::new().output_prefix("/tmp/trace");
    /// assert_eq!(cfg.get_output_prefix(), Some("/tmp/trace"));
    /// assert!(cfg.output_prefix("bad\0prefix").validate().is_err());
    /// ```
    pub fn output_prefix(mut self, prefix: impl Into<String>) -> CallConfig {
        let prefix: String = prefix.into();
        self.output_prefix = (!prefix.is_empty()).then(|| prefix.into_boxed_str());
        self
    }

    /// The AICPU scheduler thread count; `None` for the architecture's default.
    ///
    /// ```
    /// assert_eq!(simpler::chip::CallConfig::new().get_aicpu_threads(), None);
    /// ```
    pub fn get_aicpu_threads(&self) -> Option<u32> {
        self.aicpu_threads
    }

    /// The swimlane profiling level.
    ///
    /// ```
    /// assert_eq!(simpler::chip::CallConfig::new().get_swimlane(), simpler::chip::Swimlane::Off);
    /// ```
    pub fn get_swimlane(&self) -> Swimlane {
        self.swimlane
    }

    /// Whether task arguments are dumped.
    ///
    /// ```
    /// assert!(!simpler::chip::CallConfig::new().get_dump_args());
    /// ```
    pub fn get_dump_args(&self) -> bool {
        self.dump_args
    }

    /// The PMU event type recorded, if any.
    ///
    /// ```
    /// assert_eq!(simpler::chip::CallConfig::new().get_pmu_event(), None);
    /// ```
    pub fn get_pmu_event(&self) -> Option<u32> {
        self.pmu_event
    }

    /// Whether the chip-side dependency graph is generated.
    ///
    /// ```
    /// assert!(!simpler::chip::CallConfig::new().get_dep_gen());
    /// ```
    pub fn get_dep_gen(&self) -> bool {
        self.dep_gen
    }

    /// Whether scope statistics are written.
    ///
    /// ```
    /// assert!(!simpler::chip::CallConfig::new().get_scope_stats());
    /// ```
    pub fn get_scope_stats(&self) -> bool {
        self.scope_stats
    }

    /// The sizes of the ring of scope depth `depth` (all `None` when unset or out of range).
    ///
    /// ```
    /// assert_eq!(simpler::chip::CallConfig::new().get_ring(0), simpler::chip::RingSizes::default());
    /// ```
    pub fn get_ring(&self, depth: usize) -> RingSizes {
        self.rings.as_ref().and_then(|r| r.get(depth).copied()).unwrap_or_default()
    }

    /// The diagnostic output directory, if set.
    ///
    /// ```
    /// assert_eq!(simpler::chip::CallConfig::new().get_output_prefix(), None);
    /// ```
    pub fn get_output_prefix(&self) -> Option<&str> {
        self.output_prefix.as_deref()
    }

    fn any_diagnostics(&self) -> bool {
        self.swimlane != Swimlane::Off
            || self.dump_args
            || self.pmu_event.is_some()
            || self.dep_gen
            || self.scope_stats
    }

    /// Checks every knob; run at every submit.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error naming the first
    /// bad knob: 1 AICPU thread, or a count or PMU event over `i32::MAX`; a diagnostic without an
    /// output prefix; a prefix of 1024 bytes or more, or holding a NUL; a ring size out of its
    /// range.
    ///
    /// ```
    /// use simpler::chip::CallConfig;
    /// assert!(CallConfig::new().validate().is_ok());
    /// let err = CallConfig::new().aicpu_threads(1).validate().unwrap_err();
    /// assert!(err.message().contains("aicpu_threads"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let max = i32::MAX as u64;
        if let Some(n) = self.aicpu_threads
            && (n == 1 || u64::from(n) > max)
        {
            return Err(Error::invalid(format!(
                "CallConfig.aicpu_threads must be 0 (default) or in [2, {max}], got {n}"
            )));
        }
        if let Some(e) = self.pmu_event
            && u64::from(e) > max
        {
            return Err(Error::invalid(format!("CallConfig.pmu_event must be at most {max}, got {e}")));
        }
        if let Some(p) = &self.output_prefix
            && (p.len() >= OUTPUT_PREFIX_LEN || p.as_bytes().contains(&0))
        {
            return Err(Error::invalid(format!(
                "CallConfig.output_prefix must be under {OUTPUT_PREFIX_LEN} bytes with no NUL"
            )));
        }
        if self.any_diagnostics() && self.output_prefix.is_none() {
            return Err(Error::invalid("CallConfig.output_prefix is required when a diagnostic is on"));
        }
        for (i, r) in self.rings.iter().flat_map(|r| r.iter()).enumerate() {
            if let Some(w) = r.task_window
                && (!w.is_power_of_two() || !(4..=max).contains(&w))
            {
                return Err(Error::invalid(format!(
                    "CallConfig ring {i}: task_window must be a power of two in [4, {max}], got {w}"
                )));
            }
            if let Some(h) = r.heap_bytes
                && h < 1024
            {
                return Err(Error::invalid(format!(
                    "CallConfig ring {i}: heap_bytes must be >= 1024, got {h}"
                )));
            }
            if let Some(d) = r.dep_pool
                && !(4..=max).contains(&d)
            {
                return Err(Error::invalid(format!(
                    "CallConfig ring {i}: dep_pool must be in [4, {max}], got {d}"
                )));
            }
        }
        Ok(())
    }

    /// The knobs as the wire layout's integers: thread count, swimlane level, the four flags
    /// (dump args, PMU event, dep gen, scope stats).
    pub(crate) fn wire_ints(&self) -> [i32; 6] {
        let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        [
            self.aicpu_threads.map_or(0, int),
            self.swimlane.level(),
            i32::from(self.dump_args),
            self.pmu_event.map_or(0, int),
            i32::from(self.dep_gen),
            i32::from(self.scope_stats),
        ]
    }

    /// The inverse of [`wire_ints`](CallConfig::wire_ints) plus rings and prefix, with the wire
    /// layout's conventions (0 = unset; a flag is on when non-zero). Does not validate.
    pub(crate) fn from_wire(
        ints: [i32; 6],
        rings: [[u64; RING_DEPTH]; 3],
        prefix: &[u8; OUTPUT_PREFIX_LEN],
    ) -> Result<CallConfig> {
        let [threads, swimlane, dump_args, pmu, dep_gen, scope_stats] = ints;
        let non_negative = |name: &str, v: i32| {
            u32::try_from(v).map_err(|_| Error::invalid(format!("CallConfig.{name} must be >= 0, got {v}")))
        };
        let swimlane = Swimlane::from_level(swimlane).ok_or_else(|| {
            Error::invalid(format!("CallConfig.swimlane must be a level in 0..=4, got {swimlane}"))
        })?;
        let end = prefix.iter().position(|&b| b == 0).unwrap_or(OUTPUT_PREFIX_LEN);
        let prefix = std::str::from_utf8(&prefix[..end])
            .map_err(|_| Error::invalid("CallConfig.output_prefix is not UTF-8"))?;
        let mut cfg = CallConfig::new()
            .aicpu_threads(non_negative("aicpu_threads", threads)?)
            .swimlane(swimlane)
            .dump_args(non_negative("dump_args", dump_args)? != 0)
            .pmu_event(non_negative("pmu_event", pmu)?)
            .dep_gen(non_negative("dep_gen", dep_gen)? != 0)
            .scope_stats(non_negative("scope_stats", scope_stats)? != 0)
            .output_prefix(prefix);
        let [windows, heaps, pools] = rings;
        let set = |v: u64| (v != 0).then_some(v);
        for d in 0..RING_DEPTH {
            let sizes = RingSizes {
                task_window: set(windows[d]),
                heap_bytes: set(heaps[d]),
                dep_pool: set(pools[d]),
            };
            if sizes != RingSizes::default() {
                cfg = cfg.ring(d, sizes);
            }
        }
        Ok(cfg)
    }

    /// The ring sizes as the wire layout's three arrays (task windows, heaps, dep pools; 0 =
    /// unset).
    pub(crate) fn wire_rings(&self) -> [[u64; RING_DEPTH]; 3] {
        let at = |d: usize| self.get_ring(d);
        [
            std::array::from_fn(|d| at(d).task_window.unwrap_or(0)),
            std::array::from_fn(|d| at(d).heap_bytes.unwrap_or(0)),
            std::array::from_fn(|d| at(d).dep_pool.unwrap_or(0)),
        ]
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
        let c = CallConfig::new().aicpu_threads(1);
        assert!(c.validate().is_err());
        let bad = RingSizes { task_window: Some(6), ..RingSizes::default() };
        let c = CallConfig::new().ring(2, bad);
        assert!(c.validate().unwrap_err().message().contains("ring 2"));
        let c = CallConfig::new().ring(0, RingSizes { heap_bytes: Some(10), ..RingSizes::default() });
        assert!(c.validate().is_err());
        let c = CallConfig::new().output_prefix("d".repeat(OUTPUT_PREFIX_LEN));
        assert!(c.validate().is_err());
        let c = CallConfig::new().output_prefix("d".repeat(OUTPUT_PREFIX_LEN - 1));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_config_stays_small() {
        assert!(size_of::<CallConfig>() <= 64, "{}", size_of::<CallConfig>());
    }
}
