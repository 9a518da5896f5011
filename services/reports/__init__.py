"""Reports over the ledger, pure functions over records (docs/scoring.md).

- ``scoring``: the rules (what is scored, what passes, the minimum count).
- ``stats``: the statistics (Wilson, bootstrap, pass@k, paired bootstrap, McNemar).
- ``leaderboard``: rows per agent x model, and status counts.
- ``report``: the full report (leaderboard, per-task matrix, failure causes).
- ``compare``: the paired comparison of two agents.
- ``progress``: where an experiment is (done / running / queued / unscored, rate,
  ETA), the experiments list's rows and the runner fleet's: shared by the dashboard
  and the CLI's live views.
- ``tables`` / ``html``: renderings for the CLI and as a self-contained page, with
  numbers written by ``formatting`` (one way to show a figure); ``plots``: the report
  as a PNG (``report --png``; matplotlib, imported only there).
- ``queries``: the one read path: each report loaded through the Ledger port, called
  by the CLI, the HTTP API, the dashboard and ``submit --wait`` alike.
"""
