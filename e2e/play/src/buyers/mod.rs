//! Buyers under load: `users` shoppers play a sale against its gateway over
//! HTTP, the way real ones do. Each thinks (exponentially distributed
//! pauses), then browses or tries to buy one unit; an order goes through
//! the waiting room when there is one, is retried under its idempotency
//! key until its outcome is known, and is then paid (the buyer starts the
//! payment, the payment provider confirms it with a signed callback) or
//! abandoned. The share of buyers active follows a [`Profile`].
//!
//! [`run`] returns the [`Tally`] of what happened and the [`Ledger`] of
//! what the gateway acknowledged to each buyer, the evidence the checks
//! compare with what the sale's services recorded; a purchase whose
//! outcome stayed unknown is kept as unresolved, never guessed.

mod answer;
mod buyer;
mod client;
mod config;
mod crowd;
mod decide;
mod ledger;
mod profile;
mod progress;
mod purchase;
mod tally;
mod token;

pub use config::{Config, RetryPolicy, SkuLimit};
pub use crowd::{Outcome, run};
pub use ledger::{BuyerLedger, Ledger, OrderRecord, Unresolved};
pub use profile::{LOW_SHARE, Phase, Profile, ProfileError};
pub use progress::{Progress, summary};
pub use tally::{Counters, Tally};

/// Why the buyers could not play.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot be played.
    #[error("buyers configuration: {0}")]
    Config(String),
    /// The payment secret cannot sign callbacks.
    #[error("payment secret: {0}")]
    PaymentSecret(#[from] gateway::payments::SignatureError),
    /// A bearer token could not be minted.
    #[error("minting a bearer token: {0}")]
    Token(#[from] jsonwebtoken::errors::Error),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// A buyer's task failed.
    #[error("buyer task: {0}")]
    Buyer(#[from] tokio::task::JoinError),
}
