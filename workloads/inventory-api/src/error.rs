//! The error answer.

use serde::{Deserialize, Serialize};

/// The body of every refusal (4xx) and failure (5xx) of the inventory, as
/// every flash-sale API writes it (`flashsale_runtime::ApiError`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable snake_case code to branch on ([`crate::codes`]).
    pub error: String,
    /// Text for people.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_a_code_and_a_message() -> Result<(), serde_json::Error> {
        let wire = r#"{"error":"sold_out","message":"A is sold out"}"#;
        let body = ErrorBody {
            error: crate::codes::SOLD_OUT.into(),
            message: "A is sold out".into(),
        };
        assert_eq!(serde_json::to_string(&body)?, wire);
        assert_eq!(serde_json::from_str::<ErrorBody>(wire)?, body);
        Ok(())
    }
}
