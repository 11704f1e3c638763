//! Element types of tensors: [`DataType`] (16 of them) and [`Element`], sealed: the Rust types
//! a tensor's elements may be viewed as (each is `Pod`, rule R4 of `sys::mem`).

use crate::error::{Error, Result};

/// The element type of a tensor: the 15 types of the upstream runtime and `f64`, with their
/// sizes.
///
/// ```
/// use simpler::DataType;
/// assert_eq!(DataType::Float32.size(), 4);
/// assert_eq!(DataType::from_u8(7).unwrap(), DataType::Int64);
/// assert!(DataType::from_u8(16).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// 32-bit IEEE float.
    Float32 = 0,
    /// 16-bit IEEE float.
    Float16 = 1,
    /// Signed 32-bit integer.
    Int32 = 2,
    /// Signed 16-bit integer.
    Int16 = 3,
    /// Signed 8-bit integer.
    Int8 = 4,
    /// Unsigned 8-bit integer.
    Uint8 = 5,
    /// bfloat16.
    BFloat16 = 6,
    /// Signed 64-bit integer.
    Int64 = 7,
    /// Unsigned 64-bit integer.
    Uint64 = 8,
    /// Unsigned 16-bit integer.
    Uint16 = 9,
    /// Unsigned 32-bit integer.
    Uint32 = 10,
    /// Boolean stored in one byte.
    Bool = 11,
    /// 8-bit float, e4m3fn.
    Fp8E4M3Fn = 12,
    /// 8-bit float, e8m0.
    Fp8E8M0 = 13,
    /// 4-bit float e2m1, two values packed in one byte (the element size counts the byte).
    Fp4E2M1 = 14,
    /// 64-bit IEEE float (not among the upstream's types; OpenCL C's `double`).
    Float64 = 15,
}

impl DataType {
    /// Every data type, in wire order: `ALL[i].as_u8() == i`.
    ///
    /// ```
    /// use simpler::DataType;
    /// assert_eq!(DataType::ALL.len(), 16);
    /// assert_eq!(DataType::ALL[0], DataType::Float32);
    /// assert!(DataType::ALL.iter().enumerate().all(|(i, d)| usize::from(d.as_u8()) == i));
    /// ```
    pub const ALL: [DataType; 16] = [
        DataType::Float32,
        DataType::Float16,
        DataType::Int32,
        DataType::Int16,
        DataType::Int8,
        DataType::Uint8,
        DataType::BFloat16,
        DataType::Int64,
        DataType::Uint64,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Bool,
        DataType::Fp8E4M3Fn,
        DataType::Fp8E8M0,
        DataType::Fp4E2M1,
        DataType::Float64,
    ];

    /// Size of one element in bytes.
    ///
    /// [`DataType::Fp4E2M1`] packs two values per byte but reports 1, the size of that byte.
    ///
    /// ```
    /// use simpler::DataType;
    /// assert_eq!(DataType::Int64.size(), 8);
    /// assert_eq!(DataType::Float64.size(), 8);
    /// assert_eq!(DataType::BFloat16.size(), 2);
    /// assert_eq!(DataType::Bool.size(), 1);
    /// assert_eq!(DataType::Fp4E2M1.size(), 1);
    /// ```
    pub const fn size(self) -> usize {
        match self {
            DataType::Float32 | DataType::Int32 | DataType::Uint32 => 4,
            DataType::Float16 | DataType::Int16 | DataType::BFloat16 | DataType::Uint16 => 2,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
            DataType::Int8
            | DataType::Uint8
            | DataType::Bool
            | DataType::Fp8E4M3Fn
            | DataType::Fp8E8M0
            | DataType::Fp4E2M1 => 1,
        }
    }

    /// The wire value of this type (its discriminant, `0..=15`).
    ///
    /// ```
    /// use simpler::DataType;
    /// assert_eq!(DataType::Float32.as_u8(), 0);
    /// assert_eq!(DataType::Fp4E2M1.as_u8(), 14);
    /// assert_eq!(DataType::from_u8(DataType::Uint16.as_u8()).unwrap(), DataType::Uint16);
    /// ```
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Parses a wire value.
    ///
    /// # Errors
    ///
    /// Values above 15 are an [`ErrorKind::Decode`](crate::ErrorKind::Decode) error.
    ///
    /// ```
    /// use simpler::{DataType, ErrorKind};
    /// assert_eq!(DataType::from_u8(6).unwrap(), DataType::BFloat16);
    /// assert_eq!(DataType::from_u8(200).unwrap_err().kind(), ErrorKind::Decode);
    /// ```
    pub fn from_u8(v: u8) -> Result<DataType> {
        DataType::ALL
            .get(usize::from(v))
            .copied()
            .ok_or_else(|| Error::decode(format!("unknown data type {v} (known: 0..=15)")))
    }

    /// The lowercase name, as used in messages (`f32`, `bf16`, ...); `Display` prints it too.
    ///
    /// ```
    /// use simpler::DataType;
    /// assert_eq!(DataType::BFloat16.name(), "bf16");
    /// assert_eq!(DataType::Fp8E4M3Fn.name(), "fp8e4m3fn");
    /// assert_eq!(DataType::Int32.to_string(), "i32");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Float32 => "f32",
            DataType::Float16 => "f16",
            DataType::Int32 => "i32",
            DataType::Int16 => "i16",
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::BFloat16 => "bf16",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Uint16 => "u16",
            DataType::Uint32 => "u32",
            DataType::Bool => "bool",
            DataType::Fp8E4M3Fn => "fp8e4m3fn",
            DataType::Fp8E8M0 => "fp8e8m0",
            DataType::Fp4E2M1 => "fp4e2m1",
            DataType::Float64 => "f64",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be an element of a tensor.
///
/// Implemented for the plain numeric types whose layout matches a [`DataType`]. Host functions use
/// it to view a tensor as `&[T]`; a mismatch between `T` and the tensor's data type is an error.
/// `bool` is not an element (a byte other than 0 or 1 would be undefined behaviour): view
/// [`DataType::Bool`] tensors as `u8`.
///
/// ```
/// use simpler::{DataType, memory::Element};
/// assert_eq!(<f32 as Element>::DTYPE, DataType::Float32);
/// assert_eq!(<u8 as Element>::DTYPE, DataType::Uint8);
///
/// // Generic code can check a data type against the Rust type it expects.
/// fn matches<T: Element>(dtype: DataType) -> bool {
///     T::DTYPE == dtype
/// }
/// assert!(matches::<i32>(DataType::Int32));
/// assert!(!matches::<u32>(DataType::Int32));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor element type",
    label = "not an element type",
    note = "tensor elements are f32, f64, i8, i16, i32, i64, u8, u16, u32, u64"
)]
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The data type this Rust type stands for.
    ///
    /// ```
    /// use simpler::{DataType, memory::Element};
    /// assert_eq!(<i64 as Element>::DTYPE, DataType::Int64);
    /// assert_eq!(<u16 as Element>::DTYPE.size(), std::mem::size_of::<u16>());
    /// ```
    const DTYPE: DataType;
    /// The zero value.
    ///
    /// ```
    /// use simpler::memory::Element;
    /// assert_eq!(<f32 as Element>::ZERO, 0.0);
    /// assert_eq!(<i8 as Element>::ZERO, 0);
    /// ```
    const ZERO: Self;
}

mod sealed {
    /// Only plain old data may be an element (rule R4 of `sys::mem`).
    pub trait Sealed: crate::sys::mem::Pod {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            const ZERO: Self = 0 as $t;
        }
    )*};
}

element!(f32 => Float32, f64 => Float64, i32 => Int32, i16 => Int16, i8 => Int8, u8 => Uint8, i64 => Int64,
         u64 => Uint64, u16 => Uint16, u32 => Uint32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip() {
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(usize::from(d.as_u8()), i);
            assert_eq!(DataType::from_u8(d.as_u8()).unwrap(), *d);
        }
    }

    #[test]
    fn element_sizes_match_rust_types() {
        assert_eq!(DataType::Float32.size(), std::mem::size_of::<f32>());
        assert_eq!(DataType::Int64.size(), std::mem::size_of::<i64>());
        assert_eq!(DataType::Float64.size(), std::mem::size_of::<f64>());
        assert_eq!(DataType::Uint16.size(), std::mem::size_of::<u16>());
    }
}
