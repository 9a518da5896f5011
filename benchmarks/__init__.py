"""Measured comparisons of trialbus against what users would run instead.

``python -m benchmarks`` (``make bench``) runs six benchmarks on this machine in one
go and writes ``benchmarks/results.json`` and ``docs/performance.md``;
``--quick`` (``make bench-quick``, exercised once by the test suite) runs the same code
on tiny inputs. Each benchmark lives in its own module and returns a
:class:`benchmarks.harness.BenchResult`:

- ``overhead``  trialbus (embedded stack, one runner) vs ``harbor run``, same trials;
- ``scaling``   one pinned runner on one core vs two runners on two cores;
- ``pipeline``  10,000 instant trials submit -> every ResultImported, beside the raw
  JetStream and ledger ceilings (``ceilings``);
- ``submit``    validate, expand and publish a 10,000-trial experiment;
- ``import``    ``trialbus import`` of a 10,000-trial Harbor job folder;
- ``latency``   TrialRequested -> TrialStarted on an idle stack.
"""
