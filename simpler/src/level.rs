//! Levels of the hierarchy.

/// A level of the worker hierarchy.
///
/// ```
/// use simpler::status::Level;
/// assert_eq!(Level::Node.number(), 3);
/// assert_eq!(Level::from_number(4), Some(Level::Network1));
/// assert_eq!(Level::Node.name(), "node");
/// assert_eq!(Level::Chip.to_string(), "L2 (chip)");
/// assert!(Level::Chip < Level::Node); // ordered by number
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// L2: one chip.
    Chip = 2,
    /// L3: one host driving chips and SUB workers.
    Node = 3,
    /// L4: drives L3 Workers.
    Network1 = 4,
    /// L5: drives L4 Workers.
    Network2 = 5,
    /// L6: drives L5 Workers.
    Network3 = 6,
}

impl Level {
    /// The level number (2..=6).
    ///
    /// ```
    /// use simpler::status::Level;
    /// assert_eq!(Level::Chip.number(), 2);
    /// assert_eq!(Level::Network3.number(), 6);
    /// ```
    pub fn number(self) -> u32 {
        self as u32
    }

    /// The level with this number, if it has a name (2..=6).
    ///
    /// ```
    /// use simpler::status::Level;
    /// assert_eq!(Level::from_number(2), Some(Level::Chip));
    /// assert_eq!(Level::from_number(1), None);
    /// assert_eq!(Level::from_number(7), None);
    /// assert_eq!(Level::from_number(Level::Network2.number()), Some(Level::Network2));
    /// ```
    pub fn from_number(n: u32) -> Option<Level> {
        match n {
            2 => Some(Level::Chip),
            3 => Some(Level::Node),
            4 => Some(Level::Network1),
            5 => Some(Level::Network2),
            6 => Some(Level::Network3),
            _ => None,
        }
    }

    /// The level's word, used as a span prefix (`chip`, `node`, `network1`, ...).
    ///
    /// ```
    /// use simpler::status::Level;
    /// assert_eq!(Level::Chip.name(), "chip");
    /// assert_eq!(Level::Network1.name(), "network1");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Level::Chip => "chip",
            Level::Node => "node",
            Level::Network1 => "network1",
            Level::Network2 => "network2",
            Level::Network3 => "network3",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L{} ({})", self.number(), self.name())
    }
}
