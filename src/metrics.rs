//! Token accounting: per-call usage summed into a ledger, and the figures derived from it.
