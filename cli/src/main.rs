//! `kubectl-flashsale`: installed on the PATH, kubectl runs it as
//! `kubectl flashsale`.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let code = flashsale_cli::run(
        std::env::args_os().collect(),
        std::io::stdout(),
        std::io::stderr(),
    )
    .await;
    ExitCode::from(code)
}
