//! Error collection: every check pushes its spanned error here, and expansion reports all of
//! them at once (the serde `Ctxt` pattern).

use proc_macro2::{Span, TokenStream};

/// Collected errors of one expansion.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// Records an error at `span`. `message` follows the project style: lowercase first line,
    /// names in backticks, a `[S0NNN]` code, then an optional `help:` line.
    pub(crate) fn error(&mut self, span: Span, message: impl Into<String>) {
        let message = message.into();
        // De-duplicate: one report per message and place.
        let dup = self
            .errors
            .iter()
            .any(|e| e.to_string() == message && format!("{:?}", e.span()) == format!("{span:?}"));
        if !dup {
            self.errors.push(syn::Error::new(span, message));
        }
    }

    /// Records an error that underlines all of `tokens` (not only their first token).
    pub(crate) fn error_spanned(&mut self, tokens: &dyn quote::ToTokens, message: impl Into<String>) {
        let message = message.into();
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records a `syn` parse error.
    pub(crate) fn syn(&mut self, e: syn::Error) {
        self.errors.push(e);
    }

    /// Whether anything failed.
    pub(crate) fn failed(&self) -> bool {
        !self.errors.is_empty()
    }

    /// All errors as `compile_error!` invocations.
    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.errors.into_iter().map(|e| e.to_compile_error()).collect()
    }
}

/// `line:col` of a span, to cite another site in a message.
pub(crate) fn at(span: Span) -> String {
    let start = span.start();
    format!("{}:{}", start.line, start.column + 1)
}
