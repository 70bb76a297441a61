//! Colour for a terminal, plain text otherwise.

use std::io::IsTerminal;

use crate::args::Colour;

/// How text output is dressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    colour: bool,
}

impl Style {
    /// Plain text.
    pub const PLAIN: Self = Self { colour: false };
    /// ANSI colours.
    pub const COLOUR: Self = Self { colour: true };

    /// The style `choice` asks for, on standard output.
    pub fn for_stdout(choice: Colour) -> Self {
        let colour = match choice {
            Colour::Always => true,
            Colour::Never => false,
            Colour::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        };
        Self { colour }
    }

    /// Whether this style colours.
    pub const fn colours(self) -> bool {
        self.colour
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    /// Something as it should be.
    pub fn good(self, text: &str) -> String {
        self.paint("32", text)
    }

    /// Something that needs attention.
    pub fn warn(self, text: &str) -> String {
        self.paint("33", text)
    }

    /// Something wrong.
    pub fn bad(self, text: &str) -> String {
        self.paint("31", text)
    }

    /// A heading.
    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    /// A detail.
    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }
}
