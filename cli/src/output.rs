//! Where results go, in the format asked for: text for people, JSON or
//! YAML for scripts, from the same values.

use std::io::Write;

use serde::Serialize;

use crate::{
    args::{ClusterArgs, Output},
    failure::Failure,
    style::Style,
};

/// A command's results stream.
pub struct Out<O> {
    writer: O,
    format: Output,
    style: Style,
}

impl<O: Write> Out<O> {
    /// Results to `writer`, as `args` ask.
    pub fn new(writer: O, args: &ClusterArgs) -> Self {
        Self {
            writer,
            format: args.output,
            style: Style::for_stdout(args.color),
        }
    }

    /// The text style.
    pub const fn style(&self) -> Style {
        self.style
    }

    /// Whether the results are text.
    pub fn is_text(&self) -> bool {
        self.format == Output::Text
    }

    /// Bytes as they are.
    pub fn raw(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        self.writer
            .write_all(bytes)
            .and_then(|()| self.writer.flush())
            .map_err(|err| Failure::Refused(format!("writing the output: {err}")))
    }

    /// `value` as JSON or YAML, or `text` for people.
    pub fn emit<T: Serialize>(&mut self, value: &T, text: &str) -> Result<(), Failure> {
        let rendered = match self.format {
            Output::Text => text.to_owned(),
            Output::Json => serde_json::to_string_pretty(value)
                .map(|json| json + "\n")
                .map_err(|err| Failure::Refused(format!("serialising the result: {err}")))?,
            Output::Yaml => serde_yaml_ng::to_string(value)
                .map(|yaml| format!("---\n{yaml}"))
                .map_err(|err| Failure::Refused(format!("serialising the result: {err}")))?,
        };
        self.raw(rendered.as_bytes())
    }
}
