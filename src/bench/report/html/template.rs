//! The page's skeleton and stylesheet, and how their slots are filled.
//!
//! Owns `web/report.html` and `web/report.css`, embedded at build time (the page
//! must load nothing, so the stylesheet goes inside it), and [`fill`], which puts
//! a value in each `{{name}}` of the skeleton. It must not know what the slots
//! hold: the values arrive as finished, escaped HTML.

/// The page's skeleton: the document, the header, the two columns of cards and
/// the footer, with a `{{name}}` slot for each part drawn in Rust.
pub(super) const TEMPLATE: &str = include_str!("../../../../web/report.html");

/// The page's stylesheet, put in the skeleton's `<style>`.
pub(super) const CSS: &str = include_str!("../../../../web/report.css");

/// `template` with each `{{name}}` replaced by the value `slots` gives that name.
///
/// One pass over the template: a value is copied as it is, never searched for
/// slots itself, so a `{{` in a URL or a command line stays text. A `{{name}}`
/// that `slots` lacks stays as written (the tests check that the page's template
/// has none).
pub(super) fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let values: usize = slots.iter().map(|(_, v)| v.len()).sum();
    let mut out = String::with_capacity(template.len() + values);
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let found = after.find("}}").and_then(|close| {
            let name = &after[..close];
            let (_, value) = slots.iter().find(|(n, _)| *n == name)?;
            Some((close, *value))
        });
        match found {
            Some((close, value)) => {
                out.push_str(value);
                rest = &after[close + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}
