"""The mhaspec conformance suite: one test module per spec chapter, run by the pytest plugin.

Package ``mhaspec.conformance``, folder ``conformance/``: the pytest suite only. Its helpers are
split by purpose: strategies (``strategies``), running a cell (``cell``), the one judging function
(``judge``), expecting and reporting (``expect``; ``harness`` gathers the three for the tests), a
test's record (``item_state``), the saved-failure format, the plugin and its result model
(``plugin``, ``results``) and the verdicts (``verdicts``). It imports ``mhaspec.spec`` and
``mhaspec.backends``, never the commands of ``mhaspec``.

Run it with ``pytest --pyargs mhaspec.conformance [--mhaspec-backend NAME|module:attr]``
(the plugin acts only in a run that asks for the suite: :mod:`.activation`).
"""
