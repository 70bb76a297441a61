//! The run's checks as a JUnit XML report, the format CI systems read: one
//! test case per check, a failure carrying the check's figures.

use std::fmt::Write;

use super::{escape::escape, model::Check};

/// The JUnit XML of `checks`, one test suite named `suite` that took
/// `seconds`.
pub fn render_junit(suite: &str, checks: &[Check], seconds: f64) -> String {
    let failures = checks.iter().filter(|c| !c.passed).count();
    let (suite, tests) = (xml_text(suite), checks.len());
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        r#"<testsuites name="{suite}" tests="{tests}" failures="{failures}" time="{seconds:.3}">"#
    );
    let _ = writeln!(
        out,
        r#"  <testsuite name="{suite}" tests="{tests}" failures="{failures}" errors="0" skipped="0" time="{seconds:.3}">"#
    );
    for check in checks {
        let (name, detail) = (xml_text(&check.name), xml_text(&check.detail));
        let _ = write!(out, r#"    <testcase classname="{suite}" name="{name}">"#);
        if check.passed {
            let _ = write!(out, "<system-out>{detail}</system-out>");
        } else {
            let _ = write!(out, r#"<failure message="{detail}">{detail}</failure>"#);
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

/// `text` escaped for XML, without the control characters XML 1.0 cannot
/// carry at all.
fn xml_text(text: &str) -> String {
    let printable: String = text
        .chars()
        .filter(|&c| c >= ' ' || matches!(c, '\t' | '\n' | '\r'))
        .collect();
    escape(&printable).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, passed: bool, detail: &str) -> Check {
        Check {
            name: name.to_owned(),
            passed,
            detail: detail.to_owned(),
        }
    }

    #[test]
    fn every_check_is_a_test_case_and_a_failed_one_carries_its_figures() {
        let checks = [
            check("stock is conserved", true, "5,000 = 4,870 sold + 130 left"),
            check(
                "p99 stays under the SLO",
                false,
                "p99 was 412 ms > 300 ms on \"checkout\" <&> during chaos\u{1}",
            ),
        ];
        let xml = render_junit("flashsale <e2e>", &checks, 12.5);
        let doc = match roxmltree::Document::parse(&xml) {
            Ok(doc) => doc,
            Err(e) => panic!("not XML: {e}\n{xml}"),
        };
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .map(|n| {
                (
                    n.attribute("name"),
                    n.attribute("tests"),
                    n.attribute("failures"),
                )
            });
        assert_eq!(suite, Some((Some("flashsale <e2e>"), Some("2"), Some("1"))));
        let cases: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("testcase"))
            .map(|n| {
                let failure = n
                    .children()
                    .find(|c| c.has_tag_name("failure"))
                    .and_then(|f| f.attribute("message"));
                (n.attribute("name"), failure)
            })
            .collect();
        assert_eq!(
            cases,
            [
                (Some("stock is conserved"), None),
                (
                    Some("p99 stays under the SLO"),
                    Some("p99 was 412 ms > 300 ms on \"checkout\" <&> during chaos")
                ),
            ]
        );
    }
}
