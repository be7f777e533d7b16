"""Helpers the tests share, imported as ``support.NAME`` (pytest puts ``tests/`` on ``sys.path``
for its test modules, as it does for ``conftest``):

- ``serve``: a real ``bertforge serve`` process on a free port, tiny models for it, an HTTP client
  and a fuzzer (also used by ``benchmarks/bench_serve.py`` and ``benchmarks/fuzz_serve.py``);
- ``fork_runner``: a process that forks one ``bertforge`` child per command (run as a script by
  ``test_faults.py``);
- ``reliability``: tiny real artefacts and run arguments of the reliability tests;
- ``reliability_table``: the table of ``docs/reliability.md`` as data, and its counts.
"""
