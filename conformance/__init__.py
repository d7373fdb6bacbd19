"""The mhaspec conformance suite: one test module per spec chapter, run by the pytest plugin.

Package ``mhaspec.conformance``, folder ``conformance/``: the pytest suite only (strategies, the one
judging function in ``harness``, ``verdicts``, the saved-failure format, the tests, the plugin). It
imports ``mhaspec.spec`` and ``mhaspec.backends``, never the commands of ``mhaspec``.

Run it with ``pytest --pyargs mhaspec.conformance [--backend NAME|module:attr]``.
"""
