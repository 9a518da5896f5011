"""Reports over the ledger: leaderboard and status (pure functions over records)."""
