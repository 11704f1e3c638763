//! The model shared by both macros: a callable's kind, options and signature.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::spanned::Spanned;

use crate::ctxt::Ctxt;

/// `chip`, `sub` or `orch`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Chip,
    Sub,
    Orch,
}

impl Kind {
    /// The attribute keyword.
    pub(crate) fn keyword(self) -> &'static str {
        match self {
            Kind::Chip => "chip",
            Kind::Sub => "sub",
            Kind::Orch => "orch",
        }
    }

    /// The descriptor's `kind` value (`CallableKind as u32`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Kind::Chip => 1,
            Kind::Sub => 2,
            Kind::Orch => 3,
        }
    }
}

/// How a parameter is passed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    In,
    Out,
    InOut,
}

impl Mode {
    /// `ParamMode as u32`.
    pub(crate) fn code(self) -> u32 {
        match self {
            Mode::In => 1,
            Mode::Out => 2,
            Mode::InOut => 3,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::In => "In",
            Mode::Out => "Out",
            Mode::InOut => "InOut",
        }
    }
}

/// One parameter.
pub(crate) struct Param {
    pub(crate) ident: syn::Ident,
    pub(crate) ty: ParamTy,
    /// The whole declared type (for spans and the rewritten signature).
    pub(crate) decl: syn::Type,
}

#[allow(clippy::large_enum_variant)] // A compile-time model, built once per parameter.
pub(crate) enum ParamTy {
    /// `In<T>`, `Out<T>`, `InOut<T>`: the marker's path (without generics) and the element.
    Tensor { mode: Mode, marker: syn::Path, elem: syn::Type },
    /// Any other path type: a scalar, checked by the `Scalar` trait.
    Scalar,
}

impl Param {
    /// The type name recorded in the descriptor.
    pub(crate) fn type_name(&self) -> String {
        match &self.ty {
            ParamTy::Tensor { elem, .. } => squash(elem.to_token_stream()),
            ParamTy::Scalar => squash(self.decl.to_token_stream()),
        }
    }

    pub(crate) fn mode_code(&self) -> u32 {
        match &self.ty {
            ParamTy::Tensor { mode, .. } => mode.code(),
            ParamTy::Scalar => 4,
        }
    }
}

/// Token text without spaces (`Vec < f32 >` -> `Vec<f32>`).
pub(crate) fn squash(t: TokenStream) -> String {
    t.to_string().chars().filter(|c| !c.is_whitespace()).collect()
}

/// Token text for messages: `&mut Orchestrator<'_>`, `Vec<f32>`, `&'a str`.
pub(crate) fn pretty(t: TokenStream) -> String {
    let raw = t.to_string();
    let mut out = raw
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" ,", ",")
        .replace("& ", "&");
    if out.ends_with(' ') {
        out.pop();
    }
    out
}

/// Classifies a parameter type; `None` (with an error recorded) when unsupported.
pub(crate) fn classify(cx: &mut Ctxt, ty: &syn::Type) -> Option<ParamTy> {
    // A type from a `macro_rules!` `$t:ty` arrives wrapped in an invisible group.
    let mut inner = ty;
    while let syn::Type::Group(syn::TypeGroup { elem, .. }) | syn::Type::Paren(syn::TypeParen { elem, .. }) =
        inner
    {
        inner = elem;
    }
    let syn::Type::Path(tp) = inner else {
        cx.error_spanned(
            ty,
            format!(
                "unsupported parameter type `{}` [S0004]\nhelp: a callable takes `In<T>`, `Out<T>`, `InOut<T>` tensors and scalars (u8..u64, i8..i64, usize, isize, f32, f64, bool)",
                pretty(ty.to_token_stream())
            ),
        );
        return None;
    };
    let last = tp.path.segments.last()?;
    let mode = match last.ident.to_string().as_str() {
        "In" => Some(Mode::In),
        "Out" => Some(Mode::Out),
        "InOut" => Some(Mode::InOut),
        _ => None,
    };
    let Some(mode) = mode else {
        return Some(ParamTy::Scalar);
    };
    let elems: Vec<&syn::Type> = match &last.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if elems.len() != 1 {
        cx.error_spanned(
            ty,
            format!(
                "`{}` needs exactly one element type [S0004]\nhelp: write `{}<f32>`",
                mode.name(),
                mode.name()
            ),
        );
        return None;
    }
    let mut marker = tp.path.clone();
    if let Some(seg) = marker.segments.last_mut() {
        seg.arguments = syn::PathArguments::None;
    }
    Some(ParamTy::Tensor { mode, marker, elem: elems[0].clone() })
}

/// Whether `ty` is `&mut ...Orchestrator...` (the first parameter of an orchestration).
pub(crate) fn is_orchestrator(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Reference(r) if r.mutability.is_some() => match &*r.elem {
            syn::Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Orchestrator"),
            _ => false,
        },
        _ => false,
    }
}

/// The crate root the generated code names: `::simpler` or the `crate = ...` option.
pub(crate) fn root(path: Option<&syn::Path>) -> TokenStream {
    match path {
        Some(p) => p.to_token_stream(),
        None => quote!(::simpler),
    }
}

/// The crate being compiled, for descriptor paths.
pub(crate) fn crate_name() -> String {
    std::env::var("CARGO_CRATE_NAME").unwrap_or_else(|_| "unknown".to_string())
}

/// A span for generated-only names (not nameable by the user's code).
pub(crate) fn hidden() -> Span {
    Span::mixed_site()
}

/// A statement that names the user's marker type (`In<T>`, ...) where the generated signature
/// no longer does: keeps their import used, and makes rustc check that `T` is an element type.
pub(crate) fn marker_check(marker: &syn::Path, elem: &syn::Type) -> TokenStream {
    quote::quote_spanned! {elem.span()=>
        let _: ::core::marker::PhantomData<#marker<'static, #elem>> = ::core::marker::PhantomData;
    }
}
