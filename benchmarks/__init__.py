"""Measured comparisons of trialbus against what users would run instead.

``python -m benchmarks`` (``make bench``) runs eight benchmarks on this machine in one
go and writes ``benchmarks/results.json`` and ``docs/performance.md``;
``--quick`` (``make bench-quick``, exercised once by the test suite) runs the same code
on tiny inputs. Each benchmark lives in its own module and returns a
:class:`benchmarks.harness.BenchResult`:

- ``overhead``  trialbus (embedded stack, one runner) vs ``harbor run``, same trials;
- ``capacity``  N waiting trials in flight on 1/2/4/8 runners: efficiency, starts per
  trial, redeliveries, connections, memory;
- ``pipeline``  10,000 instant trials submit -> every ResultImported, beside the raw
  JetStream and ledger ceilings (``ceilings``);
- ``submit``    validate, expand and publish a 10,000-trial experiment;
- ``import``    ``trialbus import`` of a 10,000-trial Harbor job folder;
- ``latency``   TrialRequested -> TrialStarted on an idle stack;
- ``objects``   a trial folder's pack, put, get and unpack through the object store;
- ``ledger``    the reports' queries on 100,000 records in the embedded ledger.
"""
